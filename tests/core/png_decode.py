#!/usr/bin/env python3
"""An independent PNG reader (Python's standard library only: struct for the chunks, zlib for the
CRC-32, the inflate and the Adler-32) for the tests of core/png.h and of the report's screenshot.

  png_decode.py FILE.png --expect RAW   the image must be 8-bit RGB, and its pixels exactly the
                                         bytes of RAW (rows top first, R G B); exit 1 otherwise
  png_decode.py FILE.png --info         prints {"width", "height", "channels", "colors",
                                         "non_background"} as JSON: the distinct colours and the
                                         fraction of pixels unlike the top-left one

Every chunk's CRC is checked; non-interlaced images of bit depth 8, colour types 0 (grey),
2 (RGB), 4 (grey + alpha) and 6 (RGBA), all five row filters (PNG spec 9.2).
"""
import json
import struct
import sys
import zlib


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG (signature {data[:8]!r})")
    pos, idat, ihdr, ended = 8, [], None, False
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        ctype = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(ctype + body) != crc:
            raise SystemExit(f"{path}: chunk {ctype!r} has a bad CRC")
        if ctype == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            ended = True
            break
        pos += 12 + length
    if ihdr is None or not ended:
        raise SystemExit(f"{path}: no IHDR or no IEND")
    width, height, depth, color, comp, filt, interlace = ihdr
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or comp or filt or interlace:
        raise SystemExit(f"{path}: unsupported IHDR {ihdr}")
    raw = zlib.decompress(b"".join(idat))  # checks the zlib header and Adler-32
    stride = width * channels
    if len(raw) != height * (stride + 1):
        raise SystemExit(f"{path}: {len(raw)} bytes of image data for {width} x {height}")
    out = bytearray()
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            else:
                raise SystemExit(f"{path}: row {y} has filter type {f}")
            line[i] = (line[i] + pred) & 0xFF
        out += line
        prev = line
    return width, height, channels, bytes(out)


def main():
    path, mode = sys.argv[1], sys.argv[2]
    width, height, channels, pixels = read_png(path)
    if mode == "--expect":
        want = open(sys.argv[3], "rb").read()
        if channels != 3:
            raise SystemExit(f"{path}: {channels} channels, expected RGB")
        if pixels != want:
            diff = next(i for i in range(min(len(pixels), len(want))) if pixels[i] != want[i]) \
                if len(pixels) == len(want) else -1
            raise SystemExit(f"{path}: pixels differ (first byte {diff}; {len(pixels)} vs "
                             f"{len(want)} bytes)")
        print(f"{path}: {width} x {height}, pixels equal")
    elif mode == "--info":
        px = [pixels[i : i + channels] for i in range(0, len(pixels), channels)]
        first = px[0]
        print(json.dumps({
            "width": width, "height": height, "channels": channels,
            "colors": len(set(px)),
            "non_background": sum(p != first for p in px) / len(px),
        }))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
