#!/usr/bin/env bash
# Install the AMDGPU compile toolchain behind the compile[<arch>] items of HIP candidates
# (pytest_kscientist/hip/toolchain.py finds it; issue 14).
#
#   bash tools/install_hip_toolchain.sh [PREFIX]
#
# On Debian 12 (bookworm), as root:
#   1. clang-22, lld-22 and clang-tools-22 from bookworm-security, with apt-get install (the
#      system's own suite: security updates keep arriving);
#   2. the HIP headers, rocPRIM and rocThrust headers (torch's headers need them under HIP) from
#      Debian sid, and the device-library bitcode built for LLVM 22 from Debian experimental:
#      downloaded with a private apt configuration under PREFIX (signatures checked against
#      Debian's archive keyring) and unpacked with dpkg-deb -x into PREFIX/tree. Nothing is
#      installed from sid or experimental; the system's apt state is left as it was.
# PREFIX defaults to $KS_HIP_ROOT, else ${XDG_CACHE_HOME:-~/.cache}/pytest-kscientist/hip.
# PREFIX/VERSIONS records what was unpacked. Experimental packages change without notice: the
# script takes each package from the suite named below and writes the version it got.
# Not root: step 1 needs `sudo apt-get install clang-22 lld-22 clang-tools-22`; step 2 runs as
# any user (KS_HIP_SKIP_APT=1 skips step 1).
set -euo pipefail

PREFIX="${1:-${KS_HIP_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-kscientist/hip}}"
# package/suite: sid's HIP 6.4 headers accept ROCm-6-era sources (GPU MODE's MI300 runners) that
# 7.2's reject (constexpr warpSize); the LLVM-22 bitcode exists only in experimental.
PACKAGES=(
    libamdhip64-dev/sid
    librocprim-dev/sid
    librocthrust-dev/sid
    rocm-device-libs-22/experimental
)
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
start=$(date +%s)

if ! command -v dpkg-deb >/dev/null || ! command -v apt-get >/dev/null; then
    echo "install_hip_toolchain: needs a Debian system (apt-get, dpkg-deb); found none." >&2
    echo "On another system, point KS_HIP_ROOT at a ROCm install (e.g. /opt/rocm)." >&2
    exit 2
fi

if [ "${KS_HIP_SKIP_APT:-0}" != 1 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            clang-22 lld-22 clang-tools-22 >/dev/null
    elif ! command -v clang++-22 >/dev/null; then
        echo "install_hip_toolchain: clang++-22 is missing and this is not root; run" >&2
        echo "  sudo apt-get install clang-22 lld-22 clang-tools-22" >&2
        echo "(bookworm-security), then this script again with KS_HIP_SKIP_APT=1." >&2
        exit 2
    fi
fi

apt_dir="$PREFIX/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
cat >"$apt_dir/sources.list" <<EOF
deb [signed-by=$KEYRING] http://deb.debian.org/debian sid main
deb [signed-by=$KEYRING] http://deb.debian.org/debian experimental main
EOF
APT_OPTS=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o Dir::State::status=/dev/null -o Debug::NoLocking=1 -o APT::Sandbox::User=root
)
apt-get "${APT_OPTS[@]}" -qq update
rm -f "$apt_dir"/debs/*.deb
(cd "$apt_dir/debs" && apt-get "${APT_OPTS[@]}" -qq download "${PACKAGES[@]}")

tree="$PREFIX/tree"
rm -rf "$tree.new"
mkdir -p "$tree.new"
: >"$PREFIX/VERSIONS.new"
for deb in "$apt_dir"/debs/*.deb; do
    dpkg-deb -x "$deb" "$tree.new"
    dpkg-deb --show --showformat='${Package} ${Version}\n' "$deb" >>"$PREFIX/VERSIONS.new"
done
clang++-22 --version | head -1 >>"$PREFIX/VERSIONS.new"
rm -rf "$tree"
mv "$tree.new" "$tree"
mv "$PREFIX/VERSIONS.new" "$PREFIX/VERSIONS"
echo "HIP toolchain in $PREFIX ($(($(date +%s) - start)) s):"
sed 's/^/  /' "$PREFIX/VERSIONS"
