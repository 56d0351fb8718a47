"""Write kind's default storage manifest, as kind's node-image build does, from kind's own
source (pkg/build/nodeimage/const_storage.go), and print the images it names.

    python3 e2e/kind/manifests.py <kind source dir> <manifests dir>
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def go_constant(text: str, name: str, images: dict[str, str]) -> str:
    """The value of a Go string constant made of raw literals and image constants joined by +."""
    at = text.index(f"const {name} = ") + len(f"const {name} = ")
    value = ""
    while True:
        while text[at] in " \t\n":
            at += 1
        if text[at] == "`":
            end = text.index("`", at + 1)
            value += text[at + 1 : end]
            at = end + 1
        else:
            word = re.match(r"\w+", text[at:])
            assert word is not None, f"cannot read {name} at {text[at : at + 40]!r}"
            value += images[word.group(0)]
            at += word.end()
        following = at
        while text[following] in " \t":
            following += 1
        if text[following] != "+":
            return value
        at = following + 1


def main() -> None:
    source, manifests = Path(sys.argv[1]), Path(sys.argv[2])
    text = (source / "pkg/build/nodeimage/const_storage.go").read_text()
    images = dict(re.findall(r'const (\w+Image) = "([^"]+)"', text))
    storage = go_constant(text, "defaultStorageManifest", images)
    (manifests / "default-storage.yaml").write_text(storage)
    for name, image in sorted(images.items()):
        print(name, image)


if __name__ == "__main__":
    main()
