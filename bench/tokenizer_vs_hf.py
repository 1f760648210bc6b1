#!/usr/bin/env python3
"""Encode throughput of moerun's tokenizer against the Hugging Face
`tokenizers` package, one thread each, on the same corpus and tokenizer.json.

    python3 bench/tokenizer_vs_hf.py [MOERUN] [TOKENIZER_DIR ...]

MOERUN defaults to build/moerun; tokenizer folders default to the fixture
tokenizers.  Each side encodes every string of tests/fixtures/tokenizers/
corpus.json (add_special_tokens=True) string by string, best of 3 passes
after a warm-up; the pathological case is 100,000 identical letters.
Python here is a measuring tool only (pip install tokenizers).
"""
import json
import os
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "tests", "fixtures", "tokenizers", "corpus.json")


def hf_bench(tok, strings, passes=3):
    best = 1e30
    n_tok = 0
    for p in range(passes + 1):
        t0 = time.perf_counter()
        n_tok = 0
        for s in strings:
            n_tok += len(tok.encode(s, add_special_tokens=True).ids)
        t = time.perf_counter() - t0
        if p > 0:
            best = min(best, t)
    return best, n_tok


def moerun_bench(moerun, d, corpus):
    out = subprocess.run([moerun, "tokenize", d, "--bench", corpus, "--repeat", "3"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    moerun = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build", "moerun")
    dirs = sys.argv[2:] or [os.path.join(REPO, "tests", "fixtures", "tokenizers", n)
                            for n in ("qwen2", "llama3", "neox", "llama2", "mixtral")]
    strings = json.load(open(CORPUS, encoding="utf-8"))
    nbytes = sum(len(s.encode("utf-8")) for s in strings)
    patho = os.path.join("/tmp", "moerun-patho.json")
    json.dump(["a" * 100000], open(patho, "w"))
    print(f"corpus: {len(strings)} strings, {nbytes / 1e6:.2f} MB; one thread each")
    print(f"{'tokenizer':<10} {'moerun MB/s':>12} {'tokenizers MB/s':>16} {'ratio':>6}   "
          f"{'100k letters: moerun':>20} {'tokenizers':>11}")
    for d in dirs:
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        t_hf, n_hf = hf_bench(tok, strings)
        m = moerun_bench(moerun, d, CORPUS)
        assert m["tokens"] == n_hf, f"{d}: token counts differ ({m['tokens']} vs {n_hf})"
        tp_hf, _ = hf_bench(tok, ["a" * 100000], passes=1)
        tp_m = moerun_bench(moerun, d, patho)["seconds"]
        mb_m, mb_hf = m["bytes_per_s"] / 1e6, nbytes / t_hf / 1e6
        print(f"{os.path.basename(d):<10} {mb_m:>12.2f} {mb_hf:>16.2f} {mb_m / mb_hf:>6.2f}   "
              f"{tp_m * 1e3:>17.1f} ms {tp_hf * 1e3:>8.1f} ms")


if __name__ == "__main__":
    main()
