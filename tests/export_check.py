"""Loads what shoal-export wrote into a PyTorch twin of the C++ model and compares outputs.

    /usr/bin/python3 tests/export_check.py DIR [fashion_cnn|trainer_mnist]

The model is train/fashion_cnn.h's FashionCnn (the default) or examples/trainer_mnist.cpp's
Sequential written with plain layers (its tensor-parallel classifier as nn.Linear: the exported
file must hold the consolidated weights, or the strict load fails on their shapes). DIR holds
model.pt (shoal-export's pickled state_dict), model.safetensors, inputs.f32 (N x 1 x 28 x 28
float32, Fashion-MNIST test images as train/idx_dataset.h prepares them) and outputs.f32 (N x 10,
the C++ model's logits in eval mode). Exit code 0 when both files load with plain
torch.load / a pure-Python safetensors reader and the outputs agree within 1e-6; 1 otherwise.
"""
import json
import struct
import sys

import torch
from torch import nn

torch.set_num_threads(1)


class FashionCnn(nn.Module):
    def __init__(self, c1=32, c2=64, hidden=128):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2)
        self.fc1 = nn.Linear(c2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, 10)
        self.dropout = nn.Dropout(0.25)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(torch.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


def trainer_mnist(dropout=0.25):
    """examples/trainer_mnist.cpp's makeModel on one process: the same children, the same
    indices, so the state_dict names ("9.weight", "12.bias", ...) are the C++ ones."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(128, 10))


MODELS = {"fashion_cnn": FashionCnn, "trainer_mnist": trainer_mnist}

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n <= len(data) - 8, "header length past the end"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(body[b:end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def check(make, label, state, inputs, expected):
    model = make()
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        got = model(inputs)
    diff = (got - expected).abs().max().item()
    print(f"{label}: {len(state)} tensors, max abs difference {diff:.3g}")
    return diff <= 1e-6


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in MODELS):
        print(f"usage: export_check.py DIR [{'|'.join(MODELS)}]")
        return 2
    d = sys.argv[1]
    make = MODELS[sys.argv[2] if len(sys.argv) == 3 else "fashion_cnn"]
    state = torch.load(f"{d}/model.pt")
    if not isinstance(state, dict):
        print(f"torch.load returned {type(state).__name__}, not a dict")
        return 1
    with open(f"{d}/outputs.f32", "rb") as f:
        expected = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(-1, 10)
    with open(f"{d}/inputs.f32", "rb") as f:
        inputs = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(-1, 1, 28, 28)
    ok = check(make, "torch.load(model.pt)", state, inputs, expected)
    ok = check(make, "model.safetensors", read_safetensors(f"{d}/model.safetensors"), inputs,
               expected) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
