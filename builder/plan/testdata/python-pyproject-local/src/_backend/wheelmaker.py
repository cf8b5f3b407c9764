"""A PEP 517 build backend in the repository, standard library only: it packs
src/hello_app into a pure-Python wheel, so that `pip install .` needs no build
backend (setuptools, hatchling) from an index."""
import base64
import hashlib
import os
import zipfile

NAME, VERSION = "hello_app", "1.0"
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
METADATA = f"Metadata-Version: 2.1\nName: hello-app\nVersion: {VERSION}\nRequires-Python: >=3.9\n"
WHEEL = "Wheel-Version: 1.0\nGenerator: wheelmaker\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, DIST_INFO), exist_ok=True)
    for name, text in (("METADATA", METADATA), ("WHEEL", WHEEL)):
        with open(os.path.join(metadata_directory, DIST_INFO, name), "w") as f:
            f.write(text)
    return DIST_INFO


def _record(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel = f"{NAME}-{VERSION}-py3-none-any.whl"
    files = []
    for root, dirs, names in os.walk(os.path.join("src", NAME)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py"):
                full = os.path.join(root, n)
                with open(full, "rb") as f:
                    files.append((os.path.relpath(full, "src").replace(os.sep, "/"), f.read()))
    files += [(f"{DIST_INFO}/METADATA", METADATA.encode()), (f"{DIST_INFO}/WHEEL", WHEEL.encode())]
    record = [_record(p, d) for p, d in files] + [f"{DIST_INFO}/RECORD,,"]
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files:
            z.writestr(p, d)
        z.writestr(f"{DIST_INFO}/RECORD", "\n".join(record) + "\n")
    return wheel
