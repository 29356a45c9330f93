#!/usr/bin/env python3
"""Builds the text corpus of the quality benchmark (docs/QUALITY.md) from Debian packages'
documentation and the bundled calibration corpus: real English prose and code, a few tens of MB.

    apt-get install --no-install-recommends python3.11-doc debian-reference-en debian-handbook \
        postgresql-doc-15 git-doc gnu-standards python-django-doc perl-doc
    python3 bench/quality/build_corpus.py --out bench/quality/work/corpus

Writes OUT/train.jsonl and OUT/heldout.jsonl, one document per line ({"source", "path",
"text"}), and OUT/corpus.json (counts and sizes per source). A document is one HTML page (or text
file) turned into plain text with Python's html.parser: scripts, styles and the navigation blocks
of Sphinx and DocBook pages are dropped, <pre> keeps its layout, block elements end lines, runs of
blank lines become one. Identical documents are kept once. The held-out split is by document:
those whose path's CRC-32 is 0 modulo --heldout_every (default 20, about 5%) go to heldout.jsonl,
so no page is in both. Only the standard library; the result depends only on the installed files.
"""
import argparse
import glob
import hashlib
import html.parser
import json
import os
import re
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (source name, Debian package, root folder, glob patterns under it, kind)
SOURCES = [
    ("python-docs", "python3.11-doc", "/usr/share/doc/python3.11/html", ["**/*.html"], "html"),
    ("postgresql-docs", "postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html", ["*.html"], "html"),
    ("debian-handbook", "debian-handbook", "/usr/share/doc/debian-handbook/html/en-US", ["*.html"], "html"),
    ("debian-reference", "debian-reference-en", "/usr/share/debian-reference", ["*.en.html"], "html"),
    ("gnu-standards", "gnu-standards", "/usr/share/doc/gnu-standards", ["*.html"], "html"),
    ("django-docs", "python-django-doc", "/usr/share/doc/python-django-doc/html", ["**/*.html"], "html"),
    ("git-docs", "git-doc", "/usr/share/doc/git-doc", ["*.txt", "**/*.txt"], "text"),
    ("perl-docs", "perl-doc", "/usr/share/perl/5.36.0/pod", ["*.pod"], "text"),
    ("strata-calib", "(this repository)", os.path.join(ROOT, "data", "calib"), ["*.txt", "heldout/*.txt"], "text"),
]

# Pages that are indexes or tables, not prose.
SKIP_PAGES = re.compile(r"(^|/)(genindex[^/]*|py-modindex|modindex|search|bookindex|index-[^/]*|"
                        r"contents|copyright|license|changelog|release-[0-9][^/]*)\.html$|"
                        r"(^|/)releases/|(^|/)perl[0-9]+delta\.pod$")

BLOCK = {"p", "div", "section", "article", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table",
         "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "hr", "title", "figure", "caption"}
DROP = {"script", "style", "head", "nav", "noscript", "svg"}
# Navigation containers of Sphinx (python) and DocBook (postgresql, debian-handbook, -reference).
DROP_CLASSES = {"sphinxsidebar", "related", "footer", "navheader", "navfooter", "headerlink",
                "mobile-nav", "toc", "breadcrumb", "docnav", "navigation"}
VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source",
        "track", "wbr", "param"}


class TextExtractor(html.parser.HTMLParser):
    """Plain text of an HTML page: the text nodes outside dropped elements, with line breaks at
    block elements and <pre> kept as it is."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.stack = []  # (tag, dropped) of open non-void elements
        self.dropped = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        drop = tag in DROP or bool(classes & DROP_CLASSES)
        if tag in BLOCK:
            self.out.append("\n")
        if tag in VOID:
            return
        self.stack.append((tag, drop))
        if drop:
            self.dropped += 1
        if tag == "pre":
            self.pre += 1

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        # Close up to the matching open tag (HTML allows omitted end tags: </p>, </li>).
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for t, d in self.stack[i:]:
                    self.dropped -= d
                    self.pre -= t == "pre"
                del self.stack[i:]
                break
        if tag in BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if self.dropped:
            return
        if self.pre:
            self.out.append(data)
        else:
            text = re.sub(r"\s+", " ", data)
            if not self.out or self.out[-1].endswith("\n"):
                text = text.lstrip()
            if text:
                self.out.append(text)


def html_to_text(raw):
    p = TextExtractor()
    p.feed(raw)
    p.close()
    return tidy("".join(p.out))


def tidy(text):
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\xa0", " ").split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def documents(min_chars):
    for name, package, root, patterns, kind in SOURCES:
        if not os.path.isdir(root):
            sys.exit(f"build_corpus: {root} is missing; install the Debian package {package} "
                     f"(see this script's docstring)")
        paths = sorted({p for pat in patterns for p in glob.glob(os.path.join(root, pat), recursive=True)})
        for path in paths:
            rel = os.path.relpath(path, root)
            if SKIP_PAGES.search("/" + rel):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                raw = f.read()
            text = html_to_text(raw) if kind == "html" else tidy(raw)
            if len(text) >= min_chars:
                yield name, f"{name}/{rel}", text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "quality", "work", "corpus"))
    ap.add_argument("--heldout_every", type=int, default=20)
    ap.add_argument("--min_chars", type=int, default=400, help="drop shorter documents (stubs)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    seen = set()
    stats = {}
    with open(os.path.join(args.out, "train.jsonl"), "w", encoding="utf-8") as train, \
            open(os.path.join(args.out, "heldout.jsonl"), "w", encoding="utf-8") as held:
        for source, path, text in documents(args.min_chars):
            digest = hashlib.sha1(text.encode()).digest()
            if digest in seen:
                continue
            seen.add(digest)
            # The bundled held-out slice stays held out; the rest is split by the path's CRC.
            heldout = ("strata-calib/heldout/" in path or
                       (not path.startswith("strata-calib/") and zlib.crc32(path.encode()) % args.heldout_every == 0))
            split = "heldout" if heldout else "train"
            (held if heldout else train).write(json.dumps({"source": source, "path": path, "text": text},
                                                          ensure_ascii=False) + "\n")
            s = stats.setdefault(source, {"train": [0, 0], "heldout": [0, 0]})
            s[split][0] += 1
            s[split][1] += len(text.encode())
    total = {k: sum(s[k][1] for s in stats.values()) for k in ("train", "heldout")}
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump({"sources": {k: {sp: {"documents": v[sp][0], "bytes": v[sp][1]} for sp in v}
                               for k, v in stats.items()}, "bytes": total}, f, indent=1)
    for k, v in stats.items():
        print(f"{k:18s} train {v['train'][0]:5d} docs {v['train'][1] / 1e6:7.2f} MB   "
              f"heldout {v['heldout'][0]:4d} docs {v['heldout'][1] / 1e6:6.2f} MB")
    print(f"total              train {total['train'] / 1e6:.2f} MB, heldout {total['heldout'] / 1e6:.2f} MB -> {args.out}")


if __name__ == "__main__":
    main()
