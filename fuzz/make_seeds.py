#!/usr/bin/env python3
"""Writes the seed corpora of the tokenizer fuzz targets (fuzz/corpus/tokenizer_json,
fuzz/corpus/tiktoken) from the tokenizer fixtures in tests/tokenizer/fixtures: each fixture cut
down to its 256 byte tokens, the merges among them that stay within a small vocabulary, and a few
added tokens, so that a seed is a few KiB and libFuzzer runs it quickly. Multi-file inputs use the
"--- <file> ---" lines of fuzz/fuzz_files.h. Run from the repository root; the output is
committed (re-run only when the fixtures change)."""
import base64
import json
import os

FIX = "tests/tokenizer/fixtures"
OUT = "fuzz/corpus"


def small_hf(name, keep_merges=40):
    j = json.load(open(f"{FIX}/{name}/tokenizer.json", encoding="utf-8"))
    m = j["model"]
    vocab = m["vocab"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    kept = dict(by_id[:256])
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in kept and b in kept and (a + b) in vocab:
            kept[a + b] = vocab[a + b]
            merges.append(mg)
        if len(merges) >= keep_merges:
            break
    m["vocab"] = kept
    m["merges"] = merges
    j["added_tokens"] = j.get("added_tokens", [])[:3]
    return j


def dump(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write(dirname, name, text):
    os.makedirs(f"{OUT}/{dirname}", exist_ok=True)
    with open(f"{OUT}/{dirname}/{name}", "w", encoding="utf-8", newline="") as f:
        f.write(text)


def main():
    for name in ["gpt2_digits", "qwen2", "deepseek_v3", "gpt4", "llama3"]:
        j = small_hf(name)
        config = open(f"{FIX}/{name}/tokenizer_config.json", encoding="utf-8").read()
        write("tokenizer_json", name, dump(j) + "\n--- tokenizer_config.json ---\n" + config)
        write("tokenizer_json", name + "_alone", dump(j))
    # Hand-made variants: a bare model, a Roberta post-processor, an added token with every
    # matching option set.
    base = small_hf("gpt2_digits", keep_merges=8)
    bare = {"model": base["model"], "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}
    write("tokenizer_json", "bare", dump(bare))
    roberta = dict(bare)
    roberta["post_processor"] = {"type": "RobertaProcessing", "cls": ["<s>", 0], "sep": ["</s>", 2]}
    roberta["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]}
    write("tokenizer_json", "roberta", dump(roberta))
    opts = dict(bare)
    opts["added_tokens"] = [{"id": 300, "content": " <x>", "special": False, "normalized": True,
                             "lstrip": True, "rstrip": True, "single_word": True}]
    write("tokenizer_json", "added_options", dump(opts))

    lines = open(f"{FIX}/kimi/tiktoken.model", encoding="ascii").read().splitlines()
    ranks = "\n".join(lines[:300]) + "\n"
    config = json.load(open(f"{FIX}/kimi/tokenizer_config.json", encoding="utf-8"))
    decoder = dict(list(config.get("added_tokens_decoder", {}).items())[:3])
    config["added_tokens_decoder"] = {str(int(k) - 2000 + 300): v for k, v in decoder.items()}
    write("tiktoken", "kimi", ranks + "--- tokenizer_config.json ---\n" + dump(config))
    # Refused: no tokenizer_config.json names the class, so no pattern is known.
    write("tiktoken", "bad_ranks_alone", ranks)
    py = ('class TikTokenTokenizer:\n'
          '    pat_str = "|".join(\n'
          '        [\n'
          '            r"""[\\p{Han}]+""",\n'
          "            r\"\"\"\\p{N}{1,3}\"\"\",  # digits\n"
          '            r"""\\s+(?!\\S)""",\n'
          '            r"""\\s+""",\n'
          '            r""" ?[^\\s\\p{L}\\p{N}]+""",\n'
          '            r"""\\p{L}+""",\n'
          '        ]\n'
          '    )\n')
    write("tiktoken", "kimi_with_py",
          ranks + "--- tokenizer_config.json ---\n" + dump(config) +
          "\n--- tokenization_kimi.py ---\n" + py)
    simple = {"tokenizer_class": "TikTokenTokenizer"}
    write("tiktoken", "literal_pattern",
          "\n".join(f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)) +
          "\n--- tokenizer_config.json ---\n" + dump(simple) +
          "\n--- tokenization_kimi.py ---\npat_str: str = r\"\\w+|\\s+\" r\"|[^\\w\\s]+\"\n")


if __name__ == "__main__":
    main()
