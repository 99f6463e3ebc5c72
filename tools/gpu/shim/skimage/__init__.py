"""A stand-in for scikit-image on a machine without it: only ``skimage.data``'s photos that
tests/images.py crops from, read from the GPU check's bundle (tools/gpu/check.sh puts this
folder on the path only where the real package is missing)."""
