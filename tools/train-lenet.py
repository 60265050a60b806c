#!/usr/bin/python3
"""train-lenet.py - trains LeNet-5 on Fashion-MNIST for the Lynx `lenet`
service and writes its weights file and the tests' reference file
(docs/lenet.md).

Python 3 and numpy only (Debian: python3-numpy; the data set: the
dataset-fashion-mnist package). The Debian interpreter, /usr/bin/python3,
because that is the one the Debian numpy is installed for.

    tools/train-lenet.py                       train, then write both files
    tools/train-lenet.py --reference-only      recompute the reference file
                                               from an existing weights file

The network (about 61.7k parameters), input x = pixel / 255 (float32):

    conv1  6@5x5, pad 2      1x28x28 -> 6x28x28, ReLU
    pool   2x2 max           6x14x14
    conv2  16@5x5, no pad    16x10x10, ReLU
    pool   2x2 max           16x5x5 = 400 (flattened channel, row, column)
    fc1    400 -> 120, ReLU
    fc2    120 -> 84, ReLU
    fc3    84 -> 10          the logits; the class is the first largest

Training uses whatever numpy does fastest (im2col and matrix products, Adam,
a fixed seed). The reference inference does not: every output element is
summed in one canonical order (bias first, then the terms in ascending
(in-channel, ky, kx) order for a convolution and ascending input order for
a fully connected layer), each product rounded to float32 and then added
(no fused multiply-add), in float32 throughout, with elementwise numpy
operations only. accel/lenet.h follows the same order on the CPU and on a
GPU, so their logits equal the reference bit for bit.
"""
import argparse
import gzip
import os
import struct
import sys
import time
import zlib

try:
    import numpy as np
except ImportError:
    sys.exit(f"train-lenet: {sys.executable} has no numpy: install "
             "python3-numpy (deploy/install-deps.sh) and run the script "
             "with /usr/bin/python3 (as its first line says)")

DATA_DIR = "/usr/share/datasets/fashion-mnist"
F32 = np.float32

# The layer shapes (out, in, kh, kw), in file order; the file format
# (docs/lenet.md) and accel/lenet.h fix them.
LAYERS = [("conv1", (6, 1, 5, 5)), ("conv2", (16, 6, 5, 5)),
          ("fc1", (120, 400, 1, 1)), ("fc2", (84, 120, 1, 1)),
          ("fc3", (10, 84, 1, 1))]
WEIGHTS_MAGIC = b"LYNXLNT5"
WEIGHTS_VERSION = 1
WEIGHTS_HEADER = 128
REF_MAGIC = b"LYNXLREF"
REF_VERSION = 1
REF_HEADER = 32
INPUT_SCALE = 255


# ---- data ----------------------------------------------------------------

def read_idx(path):
    """An IDX file (the MNIST format), gzipped or not, as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        sys.exit(f"train-lenet: {path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    n = int(np.prod(dims))
    if len(data) != 4 + 4 * ndim + n:
        sys.exit(f"train-lenet: {path}: {len(data)} bytes, dimensions "
                 f"{dims} want {4 + 4 * ndim + n}")
    return np.frombuffer(data, np.uint8, n, 4 + 4 * ndim).reshape(dims)


def load_set(data_dir, prefix):
    def find(name):
        for p in (os.path.join(data_dir, name + ".gz"),
                  os.path.join(data_dir, name)):
            if os.path.exists(p):
                return p
        sys.exit(f"train-lenet: no {name}(.gz) in {data_dir} (install "
                 "dataset-fashion-mnist, or give --data)")
    x = read_idx(find(prefix + "-images-idx3-ubyte"))
    y = read_idx(find(prefix + "-labels-idx1-ubyte"))
    if x.shape[1:] != (28, 28) or x.shape[0] != y.shape[0] or y.max() > 9:
        sys.exit(f"train-lenet: {prefix}: unexpected shapes {x.shape} "
                 f"{y.shape}")
    return x, y


def scale(x_u8):
    """pixel / 255 in float32 (a correctly rounded division, as in C)."""
    return x_u8.astype(F32)[:, None, :, :] / F32(INPUT_SCALE)


# ---- training (fast, any summation order) --------------------------------

def im2col(x, k, pad):
    """x (N, C, H, W) -> (N*OH*OW, C*k*k), columns in (c, ky, kx) order."""
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, w = x.shape
    oh, ow = h - k + 1, w - k + 1
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    # win: (N, C, OH, OW, k, k) -> (N, OH, OW, C, k, k)
    return np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(
        n * oh * ow, c * k * k), oh, ow


def col2im(dcol, shape, k, pad):
    """The adjoint of im2col: (N*OH*OW, C*k*k) -> gradient of x (N,C,H,W)."""
    n, c, h, w = shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - k + 1, wp - k + 1
    d = dcol.reshape(n, oh, ow, c, k, k)
    dx = np.zeros((n, c, hp, wp), dcol.dtype)
    for ky in range(k):
        for kx in range(k):
            dx[:, :, ky:ky + oh, kx:kx + ow] += d[:, :, :, :, ky, kx].transpose(
                0, 3, 1, 2)
    return dx[:, :, pad:pad + h, pad:pad + w] if pad else dx


def conv_fwd(x, w, b, pad):
    o, c, k, _ = w.shape
    col, oh, ow = im2col(x, k, pad)
    out = col @ w.reshape(o, -1).T + b
    n = x.shape[0]
    return out.reshape(n, oh, ow, o).transpose(0, 3, 1, 2), col


def conv_bwd(dout, col, x_shape, w, pad, need_dx):
    o, c, k, _ = w.shape
    d = dout.transpose(0, 2, 3, 1).reshape(-1, o)
    dw = (d.T @ col).reshape(w.shape)
    db = d.sum(axis=0)
    dx = col2im(d @ w.reshape(o, -1), x_shape, k, pad) if need_dx else None
    return dx, dw, db


def pool_fwd(x):
    """2x2 max pooling; also the position of each window's winner (the
    first maximum, so a tie does not double the gradient)."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(
        0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    arg = win.argmax(axis=4)
    return np.take_along_axis(win, arg[..., None], 4)[..., 0], arg


def pool_bwd(dout, arg, shape):
    n, c, h, w = shape
    d = (arg[..., None] == np.arange(4)) * dout[..., None]
    return d.reshape(n, c, h // 2, w // 2, 2, 2).transpose(
        0, 1, 2, 4, 3, 5).reshape(shape).astype(F32)


def init_params(rng):
    p = {}
    for name, (o, i, kh, kw) in LAYERS:
        fan_in = i * kh * kw
        w = rng.normal(0.0, np.sqrt(2.0 / fan_in), (o, i, kh, kw))
        if name.startswith("fc"):
            w = w.reshape(o, i)
        p[name + ".w"] = w.astype(F32)
        p[name + ".b"] = np.zeros(o, F32)
    return p


def forward_train(p, x):
    c1, col1 = conv_fwd(x, p["conv1.w"], p["conv1.b"], 2)
    r1 = np.maximum(c1, 0)
    p1, m1 = pool_fwd(r1)
    c2, col2 = conv_fwd(p1, p["conv2.w"], p["conv2.b"], 0)
    r2 = np.maximum(c2, 0)
    p2, m2 = pool_fwd(r2)
    f0 = p2.reshape(x.shape[0], -1)
    h1 = np.maximum(f0 @ p["fc1.w"].T + p["fc1.b"], 0)
    h2 = np.maximum(h1 @ p["fc2.w"].T + p["fc2.b"], 0)
    logits = h2 @ p["fc3.w"].T + p["fc3.b"]
    cache = (x, c1, col1, r1, m1, p1, c2, col2, r2, m2, f0, h1, h2)
    return logits, cache


def backward(p, cache, dlogits):
    x, c1, col1, r1, m1, p1, c2, col2, r2, m2, f0, h1, h2 = cache
    g = {}
    g["fc3.w"] = dlogits.T @ h2
    g["fc3.b"] = dlogits.sum(0)
    d = (dlogits @ p["fc3.w"]) * (h2 > 0)
    g["fc2.w"] = d.T @ h1
    g["fc2.b"] = d.sum(0)
    d = (d @ p["fc2.w"]) * (h1 > 0)
    g["fc1.w"] = d.T @ f0
    g["fc1.b"] = d.sum(0)
    d = (d @ p["fc1.w"]).reshape(p1.shape[0], 16, 5, 5)
    d = pool_bwd(d, m2, r2.shape) * (c2 > 0)
    d, g["conv2.w"], g["conv2.b"] = conv_bwd(d, col2, p1.shape, p["conv2.w"],
                                             0, True)
    d = pool_bwd(d, m1, r1.shape) * (c1 > 0)
    _, g["conv1.w"], g["conv1.b"] = conv_bwd(d, col1, x.shape, p["conv1.w"],
                                             2, False)
    return g


def softmax_xent(logits, y):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = -np.log(prob[np.arange(n), y] + 1e-12).mean()
    prob[np.arange(n), y] -= 1
    return loss, (prob / n).astype(F32)


def fast_accuracy(p, x_u8, y, batch=1000):
    ok = 0
    for s in range(0, len(y), batch):
        logits, _ = forward_train(p, scale(x_u8[s:s + batch]))
        ok += int((logits.argmax(1) == y[s:s + batch]).sum())
    return ok / len(y)


def train(args, xtr, ytr, xte, yte):
    rng = np.random.default_rng(args.seed)
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    step = 0
    n = len(ytr)
    for epoch in range(args.epochs):
        # step decay: the last third of the epochs at a tenth of the rate
        lr = args.lr * (0.1 if epoch >= args.epochs * 2 // 3 else 1.0)
        order = rng.permutation(n)
        t0 = time.time()
        tot = 0.0
        for s in range(0, n, args.batch):
            idx = order[s:s + args.batch]
            logits, cache = forward_train(p, scale(xtr[idx]))
            loss, dl = softmax_xent(logits, ytr[idx])
            tot += loss * len(idx)
            g = backward(p, cache, dl)
            step += 1
            for k in p:
                gk = g[k].astype(F32)
                if k.endswith(".w") and args.weight_decay:
                    gk = gk + F32(args.weight_decay) * p[k]
                m[k] = b1 * m[k] + (1 - b1) * gk
                v[k] = b2 * v[k] + (1 - b2) * gk * gk
                mh = m[k] / (1 - b1 ** step)
                vh = v[k] / (1 - b2 ** step)
                p[k] = (p[k] - lr * mh / (np.sqrt(vh) + eps)).astype(F32)
        acc = fast_accuracy(p, xte, yte)
        print(f"epoch {epoch + 1}/{args.epochs}: lr {lr:g} loss "
              f"{tot / n:.4f} test accuracy {acc * 100:.2f}% "
              f"({time.time() - t0:.0f} s)", flush=True)
    return p


# ---- the reference inference (canonical order, bit-exact in C) -----------

def ref_conv(x, w, b, pad):
    """x (N, C, H, W) float32; out[n, o, y, x] = b[o], then + w[o,c,ky,kx] *
    in[n, c, y+ky-pad, x+kx-pad] for c, ky, kx ascending, padding pixels
    being +0.0 terms like any other. One rounded product and one rounded add
    per term (separate numpy ufuncs: no fused multiply-add)."""
    o, c, k, _ = w.shape
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    oh, ow = h - k + 1, wd - k + 1
    acc = np.empty((n, o, oh, ow), F32)
    acc[...] = b[None, :, None, None]
    for ci in range(c):
        for ky in range(k):
            for kx in range(k):
                prod = np.multiply(w[None, :, ci, ky, kx, None, None],
                                   x[:, ci, None, ky:ky + oh, kx:kx + ow],
                                   dtype=F32)
                acc = np.add(acc, prod, dtype=F32)
    return acc


def ref_relu(x):
    # v > 0 ? v : +0.0, as in C (np.maximum leaves the sign of -0.0 open)
    return np.where(x > 0, x, F32(0)).astype(F32)


def ref_pool(x):
    """2x2 max, first (0,0), then (0,1), (1,0), (1,1), taking a later value
    only when strictly greater (as in C)."""
    a = x[:, :, 0::2, 0::2]
    for dy, dx in ((0, 1), (1, 0), (1, 1)):
        b = x[:, :, dy::2, dx::2]
        a = np.where(b > a, b, a)
    return a.astype(F32)


def ref_fc(x, w, b):
    """x (N, I); out[n, o] = b[o], then + w[o, i] * x[n, i] for i
    ascending."""
    o, i_n = w.shape
    acc = np.empty((x.shape[0], o), F32)
    acc[...] = b[None, :]
    for i in range(i_n):
        prod = np.multiply(w[None, :, i], x[:, i, None], dtype=F32)
        acc = np.add(acc, prod, dtype=F32)
    return acc


def ref_logits(p, x_u8, batch=1000):
    out = np.empty((len(x_u8), 10), F32)
    for s in range(0, len(x_u8), batch):
        x = scale(x_u8[s:s + batch])
        h = ref_pool(ref_relu(ref_conv(x, p["conv1.w"], p["conv1.b"], 2)))
        h = ref_pool(ref_relu(ref_conv(h, p["conv2.w"], p["conv2.b"], 0)))
        h = h.reshape(h.shape[0], 400)
        h = ref_relu(ref_fc(h, p["fc1.w"].reshape(120, 400), p["fc1.b"]))
        h = ref_relu(ref_fc(h, p["fc2.w"].reshape(84, 120), p["fc2.b"]))
        out[s:s + batch] = ref_fc(h, p["fc3.w"].reshape(10, 84), p["fc3.b"])
    return out


def ref_classes(logits):
    # the first largest, as in C (argmax returns the first maximum)
    return logits.argmax(axis=1).astype(np.uint8)


# ---- files ---------------------------------------------------------------

def params_blob(p):
    parts = []
    for name, shape in LAYERS:
        parts.append(np.ascontiguousarray(p[name + ".w"], "<f4").reshape(
            shape).tobytes())
        parts.append(np.ascontiguousarray(p[name + ".b"], "<f4").tobytes())
    return b"".join(parts)


def write_weights(path, p, correct, total):
    blob = params_blob(p)
    for k, a in p.items():
        if not np.all(np.isfinite(a)):
            sys.exit(f"train-lenet: {k} is not finite: not writing {path}")
    hdr = bytearray(WEIGHTS_HEADER)
    struct.pack_into("<8sIIIIIIII", hdr, 0, WEIGHTS_MAGIC, WEIGHTS_VERSION,
                     WEIGHTS_HEADER, len(LAYERS), len(blob) // 4,
                     zlib.crc32(blob), correct, total, INPUT_SCALE)
    for i, (_, shape) in enumerate(LAYERS):
        struct.pack_into("<IIII", hdr, 40 + 16 * i, *shape)
    write_atomic(path, bytes(hdr) + blob)


def read_weights(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < WEIGHTS_HEADER or data[:8] != WEIGHTS_MAGIC:
        sys.exit(f"train-lenet: {path}: not a LeNet weights file")
    (ver, hlen, nl, nparam, crc, correct, total,
     sc) = struct.unpack_from("<IIIIIIII", data, 8)
    if ver != WEIGHTS_VERSION or hlen != WEIGHTS_HEADER or nl != len(LAYERS) \
            or sc != INPUT_SCALE or len(data) != hlen + 4 * nparam \
            or zlib.crc32(data[hlen:]) != crc:
        sys.exit(f"train-lenet: {path}: bad header or checksum")
    p, off = {}, hlen
    for i, (name, shape) in enumerate(LAYERS):
        if struct.unpack_from("<IIII", data, 40 + 16 * i) != shape:
            sys.exit(f"train-lenet: {path}: layer {name} has another shape")
        nw, nb = int(np.prod(shape)), shape[0]
        w = np.frombuffer(data, "<f4", nw, off).astype(F32)
        off += 4 * nw
        p[name + ".b"] = np.frombuffer(data, "<f4", nb, off).astype(F32)
        off += 4 * nb
        p[name + ".w"] = w.reshape(shape if name.startswith("conv")
                                   else shape[:2])
    return p, crc


def write_reference(path, crc, classes, correct, logits):
    hdr = struct.pack("<8sIIIIII", REF_MAGIC, REF_VERSION, len(classes),
                      len(logits), crc, correct, 0)
    assert len(hdr) == REF_HEADER
    write_atomic(path, hdr + classes.tobytes() +
                 np.ascontiguousarray(logits, "<f4").tobytes())


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DATA_DIR,
                    help="directory of the Fashion-MNIST IDX files")
    ap.add_argument("--out", default=os.path.join(root, "models",
                                                  "lenet-fashion.bin"))
    ap.add_argument("--ref", default=os.path.join(root, "models",
                                                  "lenet-fashion.ref"))
    ap.add_argument("--ref-logits", type=int, default=500,
                    help="test images whose logits the reference keeps")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--min-accuracy", type=float, default=0.88)
    ap.add_argument("--reference-only", action="store_true",
                    help="no training: the reference of the --out file")
    args = ap.parse_args()

    xte, yte = load_set(args.data, "t10k")
    if args.reference_only:
        p, crc = read_weights(args.out)
    else:
        xtr, ytr = load_set(args.data, "train")
        print(f"train-lenet: {len(ytr)} training, {len(yte)} test images; "
              f"{args.epochs} epochs, batch {args.batch}, Adam lr {args.lr}, "
              f"seed {args.seed}", flush=True)
        p = train(args, xtr, ytr, xte, yte)

    t0 = time.time()
    logits = ref_logits(p, xte)
    classes = ref_classes(logits)
    correct = int((classes == yte).sum())
    acc = correct / len(yte)
    print(f"train-lenet: reference inference {time.time() - t0:.0f} s: test "
          f"accuracy {correct}/{len(yte)} = {acc * 100:.2f}%", flush=True)
    if acc < args.min_accuracy:
        sys.exit(f"train-lenet: accuracy {acc * 100:.2f}% below "
                 f"{args.min_accuracy * 100:.0f}%: files not written")
    if not args.reference_only:
        write_weights(args.out, p, correct, len(yte))
        p, crc = read_weights(args.out)  # the reference of what was written
        if not np.array_equal(ref_logits(p, xte[:args.ref_logits]),
                              logits[:args.ref_logits]):
            sys.exit("train-lenet: the written weights give other logits")
    write_reference(args.ref, crc, classes, correct,
                    logits[:args.ref_logits])
    print("train-lenet: wrote " + (args.ref if args.reference_only
                                   else f"{args.out} {args.ref}"))


if __name__ == "__main__":
    main()
