"""What both processes speak: framed messages, the sampled elements, the input perturbations."""
