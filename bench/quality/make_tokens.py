#!/usr/bin/env python3
"""Trains the quality benchmark's tokenizer on the corpus of build_corpus.py, turns the corpus into
token ids and packs everything the GPU machine needs into one xz file (docs/QUALITY.md).

    python3 bench/quality/make_tokens.py --corpus bench/quality/work/corpus \
        --out bench/quality/work/quality_data.tar.xz

Needs the `tokenizers` package (Hugging Face's; transformers depends on it). The tokenizer: a
byte-level BPE (GPT-2's pre-tokenizer regex, ByteLevel last, which strata's tokenizer reads:
docs/TOKENIZER.md) of --vocab_size ids (default 16384, so ids fit in uint16), trained on the
training split only, with one special token `<|endoftext|>` that ends every document.

The archive holds one folder, quality_data/:
- tokenizer.json, tokenizer_config.json: copied into the trained model's folder;
- train.u16, heldout.u16: every document's ids followed by `<|endoftext|>`, concatenated, as
  little-endian uint16 (the trainer's data and its held-out perplexity);
- calib.jsonl: --calib_seqs sequences of --calib_len ids from the training stream (for
  `strata quantize --calib_data`), evenly spaced over it;
- heldout.jsonl: --eval_seqs sequences of --eval_len ids from the held-out stream, evenly spaced
  (for `strata compare --tokens`, one JSON list per line);
- meta.json: sizes, counts and the options.
"""
import argparse
import io
import json
import os
import tarfile
import time

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train_tokenizer(docs, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def stream(tok, docs):
    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def windows(ids, count, length):
    """`count` windows of `length` ids, evenly spaced over `ids` (deterministic)."""
    if len(ids) < length:
        raise SystemExit(f"make_tokens: {len(ids)} ids cannot give a window of {length}")
    last = len(ids) - length
    starts = np.linspace(0, last, count).round().astype(np.int64)
    return [ids[s:s + length].tolist() for s in starts]


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--corpus", default=os.path.join(here, "work", "corpus"))
    ap.add_argument("--out", default=os.path.join(here, "work", "quality_data.tar.xz"))
    ap.add_argument("--vocab_size", type=int, default=16384)
    ap.add_argument("--max_train_docs", type=int, default=0, help="0: all (a smaller number for a quick test)")
    ap.add_argument("--calib_seqs", type=int, default=128)
    ap.add_argument("--calib_len", type=int, default=512)
    ap.add_argument("--eval_seqs", type=int, default=16)
    ap.add_argument("--eval_len", type=int, default=512)
    args = ap.parse_args()
    if args.vocab_size > 65536:
        raise SystemExit("make_tokens: --vocab_size must be at most 65536 (ids are stored as uint16)")

    t0 = time.time()
    train_docs = read_docs(os.path.join(args.corpus, "train.jsonl"))
    held_docs = read_docs(os.path.join(args.corpus, "heldout.jsonl"))
    if args.max_train_docs:
        train_docs = train_docs[:: max(1, len(train_docs) // args.max_train_docs)][: args.max_train_docs]
    tok = train_tokenizer(train_docs, args.vocab_size)
    print(f"tokenizer: {tok.get_vocab_size()} ids, trained in {time.time() - t0:.1f} s")
    train_ids = stream(tok, train_docs)
    held_ids = stream(tok, held_docs)
    train_bytes = sum(len(d.encode()) for d in train_docs)
    print(f"train: {len(train_docs)} documents, {train_bytes / 1e6:.2f} MB, {len(train_ids)} tokens "
          f"({train_bytes / len(train_ids):.2f} bytes/token); heldout: {len(held_docs)} documents, {len(held_ids)} tokens")

    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
           "bos_token": None, "unk_token": None, "add_bos_token": False, "add_eos_token": False,
           "model_max_length": 4096, "clean_up_tokenization_spaces": False}
    meta = {"vocab_size": tok.get_vocab_size(), "eos_token_id": tok.token_to_id(EOS),
            "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)),
            "train_documents": len(train_docs), "heldout_documents": len(held_docs),
            "calib": [args.calib_seqs, args.calib_len], "eval": [args.eval_seqs, args.eval_len],
            "options": vars(args)}
    jsonl = lambda seqs: "".join(json.dumps(s) + "\n" for s in seqs).encode()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with tarfile.open(args.out, "w:xz", preset=9) as tar:
        add_bytes(tar, "quality_data/tokenizer.json", tok.to_str().encode())
        add_bytes(tar, "quality_data/tokenizer_config.json", json.dumps(cfg, indent=1).encode())
        add_bytes(tar, "quality_data/train.u16", train_ids.astype("<u2").tobytes())
        add_bytes(tar, "quality_data/heldout.u16", held_ids.astype("<u2").tobytes())
        add_bytes(tar, "quality_data/calib.jsonl", jsonl(windows(train_ids, args.calib_seqs, args.calib_len)))
        add_bytes(tar, "quality_data/heldout.jsonl", jsonl(windows(held_ids, args.eval_seqs, args.eval_len)))
        add_bytes(tar, "quality_data/meta.json", json.dumps(meta, indent=1).encode())
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e6:.2f} MB in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
