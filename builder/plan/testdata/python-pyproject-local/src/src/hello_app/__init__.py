"""The app's package, under src/: main.py imports it from where `pip install .` put it,
not from the tree."""
import os
import sys


def hello():
    v = sys.version_info
    return f"hello from hello_app 1.0 on python {v.major}.{v.minor} as uid {os.getuid()}"
