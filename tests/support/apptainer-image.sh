#!/bin/sh
# Build, as a user in a job on a worker and with nothing from a network, one Apptainer image
# from a definition file twice: DIR/image.sif and the sandbox directory DIR/image-dir. The
# definition bootstraps from DIR/base, a root filesystem of a few of the worker's own programs
# and their libraries. Its runscript, and /etc/slonk-image, say "built from a definition file".
#
#   sh apptainer-image.sh DIR
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
rm -rf base image-dir image.sif
mkdir base
for program in /bin/sh /bin/cat /usr/bin/id /usr/bin/env; do
  cp --parents -L "$program" base/
  for library in $(ldd "$program" | grep -o '/[^ ]*'); do
    cp --parents -L -n "$library" base/
  done
done
cat > image.def <<'DEFINITION'
Bootstrap: localimage
From: base

%post
    echo "built from a definition file" > /etc/slonk-image

%runscript
    cat /etc/slonk-image
DEFINITION
apptainer --silent build image.sif image.def
apptainer --silent build --sandbox image-dir image.def
