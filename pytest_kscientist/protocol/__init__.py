"""What both processes speak: framed messages, large outputs handed over, input changes."""
