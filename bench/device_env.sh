# Sourced by the device scripts (bench/device_timing.sh, bench/formats_device.sh) after they set
# OUT: installs the carried wheels (.whl/, from bench/fetch_wheels.sh) into /tmp/site and loads
# the plugin from the working tree (it is not pip-installed on the device machine), with its
# pytest entry point.
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 || echo "wheels did not install"
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The plugin's entry point, as an install would register it, while its code stays the working
# tree's: PYTEST_PLUGINS made pytest warn that it could not rewrite the plugin (an error under
# -W error, and a "1 warning" line in every session's summary).
mkdir -p /tmp/site/pytest_kscientist-0.dist-info
printf 'Metadata-Version: 2.1\nName: pytest-kscientist\nVersion: 0\n' \
  >/tmp/site/pytest_kscientist-0.dist-info/METADATA
printf '[pytest11]\nkscientist = pytest_kscientist.plugin\n' \
  >/tmp/site/pytest_kscientist-0.dist-info/entry_points.txt
