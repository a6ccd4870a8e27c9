# Sourced by the device scripts (bench/device_timing.sh, bench/formats_device.sh) after they set
# OUT: installs the carried wheels (.whl/, from bench/fetch_wheels.sh) into /tmp/site and loads
# the plugin from the working tree (it is not pip-installed on the device machine).
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 || echo "wheels did not install"
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTEST_PLUGINS=pytest_kscientist.plugin
