#!/usr/bin/env python3
"""An independent reader of the event files `shoal tensorboard` writes (tests/tensorboard_test.cpp).

Shares no code with tools/tensorboard_writer.cpp: its own CRC-32C, TFRecord framing and protobuf
wire parsing, from the formats' descriptions (TFRecord; tensorflow/core/util/event.proto and
framework/summary.proto). Strict: any bad CRC, truncated record, unknown field, wrong wire type,
misplaced file_version or stray file fails with one line on stderr and exit status 1.

usage: tensorboard_decode.py LOGDIR
prints JSON: {"<run folder>": {"file": NAME, "version": "brain.Event:2", "version_wall_time": W,
              "scalars": [[tag, step, value, wall_time], ...]}, ...}
"""
import json
import os
import re
import struct
import sys


def make_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = make_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Bad(Exception):
    pass


def varint(buf, at):
    shift = 0
    value = 0
    while True:
        if at >= len(buf):
            raise Bad("truncated varint")
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise Bad("varint longer than 10 bytes")


def fields(buf):
    """(field number, wire type, value) of each field of a message."""
    at = 0
    out = []
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            if at + 8 > len(buf):
                raise Bad("truncated fixed64")
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            n, at = varint(buf, at)
            if at + n > len(buf):
                raise Bad("truncated length-delimited field")
            value, at = buf[at:at + n], at + n
        elif wire == 5:
            if at + 4 > len(buf):
                raise Bad("truncated fixed32")
            value, at = buf[at:at + 4], at + 4
        else:
            raise Bad(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def expect(cond, what):
    if not cond:
        raise Bad(what)


def decode_value(buf):
    tag = None
    value = None
    for number, wire, v in fields(buf):
        if number == 1:
            expect(wire == 2, "Value.tag wire type")
            tag = v.decode("utf-8")  # strict: proto3 strings are UTF-8
        elif number == 2:
            expect(wire == 5, "Value.simple_value wire type")
            value = struct.unpack("<f", v)[0]
        else:
            raise Bad(f"unexpected Value field {number}")
    expect(tag is not None and value is not None, "Value without tag or simple_value")
    return tag, value


def decode_event(buf):
    event = {"wall_time": None, "step": 0, "file_version": None, "values": []}
    summaries = 0
    for number, wire, v in fields(buf):
        if number == 1:
            expect(wire == 1, "Event.wall_time wire type")
            event["wall_time"] = struct.unpack("<d", v)[0]
        elif number == 2:
            expect(wire == 0, "Event.step wire type")
            event["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif number == 3:
            expect(wire == 2, "Event.file_version wire type")
            event["file_version"] = v.decode("utf-8")
        elif number == 5:
            expect(wire == 2, "Event.summary wire type")
            summaries += 1
            for n2, w2, v2 in fields(v):
                expect(n2 == 1 and w2 == 2, f"unexpected Summary field {n2}")
                event["values"].append(decode_value(v2))
        else:
            raise Bad(f"unexpected Event field {number}")
    expect(event["wall_time"] is not None, "Event without wall_time")
    expect((event["file_version"] is None) != (summaries == 0),
           "an Event must hold exactly one of file_version and summary")
    return event


def records(data):
    at = 0
    while at < len(data):
        expect(at + 12 <= len(data), f"truncated record header at byte {at}")
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        expect(length_crc == masked(header), f"bad length CRC at byte {at}")
        body_at = at + 12
        expect(body_at + length + 4 <= len(data), f"truncated record at byte {at}")
        body = data[body_at:body_at + length]
        (data_crc,) = struct.unpack("<I", data[body_at + length:body_at + length + 4])
        expect(data_crc == masked(body), f"bad data CRC at byte {at}")
        yield body
        at = body_at + length + 4


def decode_file(path):
    with open(path, "rb") as f:
        data = f.read()
    out = {"file": os.path.basename(path), "scalars": []}
    for i, body in enumerate(records(data)):
        event = decode_event(body)
        if i == 0:
            expect(event["file_version"] is not None, "first record is not file_version")
            out["version"] = event["file_version"]
            out["version_wall_time"] = event["wall_time"]
            continue
        expect(event["file_version"] is None, f"file_version again in record {i}")
        for tag, value in event["values"]:
            out["scalars"].append([tag, event["step"], value, event["wall_time"]])
    expect("version" in out, "empty file")
    return out


def main():
    if len(sys.argv) != 2:
        print("usage: tensorboard_decode.py LOGDIR", file=sys.stderr)
        return 2
    logdir = sys.argv[1]
    name = re.compile(r"^events\.out\.tfevents\.\d{10,}\.[^/]+$")
    result = {}
    try:
        for run in sorted(os.listdir(logdir)):
            folder = os.path.join(logdir, run)
            if not os.path.isdir(folder):
                continue
            files = [f for f in sorted(os.listdir(folder)) if "tfevents" in f]
            expect(len(files) == 1, f"{folder}: {len(files)} event files, expected 1")
            expect(name.match(files[0]), f"{folder}: bad file name {files[0]}")
            stray = [f for f in os.listdir(folder) if f not in files]
            expect(not stray, f"{folder}: stray files {stray}")
            result[run] = decode_file(os.path.join(folder, files[0]))
    except (Bad, UnicodeDecodeError, OSError) as e:
        print(f"tensorboard_decode.py: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
