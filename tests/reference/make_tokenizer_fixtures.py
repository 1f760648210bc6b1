#!/usr/bin/env python3
"""Builds the tokenizer conformance fixtures under tests/fixtures/tokenizers/.

Needs the PyPI `tokenizers` package (fixtures were made with 0.23).  Nothing
at build or test time runs this script; its outputs are committed.

For each pipeline used by a supported model family, a small BPE model is
trained on a generated multilingual corpus and saved as
<name>/tokenizer.json (+ tokenizer_config.json).  A shared corpus.json holds
the test strings; <name>/expected.json holds, for every string, the ids from
encode(text, add_special_tokens=True) and decode(ids,
skip_special_tokens=False), the latter only where it differs from the input
(see expected_entry; keeps the fixtures small).  Everything is deterministic (seeded).
A folder may add its own strings (family chat markers and their lookalikes)
in <name>/extra.json; its expected.json then covers corpus.json followed by
them.  For the gptoss and deepseek3 folders the script also loads the folder
with transformers' AutoTokenizer (tokenizer.json read together with
tokenizer_config.json) and stops if it disagrees with the expected files.

    python3 make_tokenizer_fixtures.py [NAME...]   # all folders, or only these

Long strings (10,000+ characters) are stored like the others; the 100,000
letter stress case is generated in the C test and checked by round trip.
"""
import json
import os
import random
import unicodedata

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "tokenizers")

QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k_base's pat_str, which o200k_harmony (gpt-oss) reuses: tiktoken
# tiktoken_ext/openai_public.py (release 0.14.0), joined with "|" as there.
O200K_RE = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# DeepSeek-V3's three Split regexes, as the JSON string literals of its
# tokenizer.json (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM spells the
# same three).  The third has raw CR and LF characters inside its classes
# (JSON \r\n), not the regex escapes.
DS3_DIGITS_RE = r"\p{N}{1,3}"
DS3_CJK_RE = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"  # [一-龥぀-ゟ゠-ヿ]+: CJK, kana
DS3_MAIN_RE = json.loads(r'''"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"''')

# ---------------------------------------------------------------- text pools
WORDS = {
    "en": "the quick brown fox jumps over lazy dog it's we're they've I'm you'll he'd "
          "tokenizer inference model expert router attention cache hello world don't "
          "HELLO World's IT'S WE'RE Python function return value number string".split(),
    "fr": "élève café naïve garçon où déjà français œuvre très noël à côté être".split(),
    "de": "Straße Größe Übung Mädchen schön Fußgänger Äpfel Öl über".split(),
    "es": "niño señor mañana árbol canción corazón pingüino España".split(),
    "ru": "привет мир Москва программа токенизатор язык Ёлка съешь ещё".split(),
    "el": "γειά σου κόσμε Αθήνα λόγος ψυχή ΣΟΦΙΑ φιλοσοφία".split(),
    "ar": "مرحبا بالعالم اللغة العربية كتاب مدرسة السلام".split(),
    "he": "שלום עולם עברית ספר ילדים מחשב".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा किताब विद्यालय क्षत्रिय".split(),
    "zh": ["你好世界", "中文分词", "机器学习", "模型", "专家混合", "北京", "汉字", "鑫", "龘"],
    "ja": ["こんにちは", "世界", "カタカナ", "ひらがな", "東京", "日本語の文章"],
    "th": ["สวัสดีครับ", "ภาษาไทย", "ประเทศไทย", "กรุงเทพ"],
    "ko": ["안녕하세요", "세계", "한국어", "토크나이저", "서울"],
}
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🤖", "🧑🏾‍💻", "✨", "🙂‍↔️", "#️⃣"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; i++) a[i] += b[i];",
    "if x != None and y >= 3: print('ok')",
    "SELECT id, name FROM users WHERE age > 21;",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "fn main() { let v: Vec<u32> = vec![]; }",
    "<div class=\"x\">&amp;</div>",
    "x = 1_000_000 + 0xFF - 3.14159e-10",
    "$ ls -la | grep '^d' && echo done",
]
LOOKALIKES = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
    "<|im_", "<|im_start", "im_start|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<think>", "</think>", "<0x41>", "<0xZZ>", "<mask>", "hello world", "<|",
]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t", "    ", "\u3000",
          "\u00a0", "\u2003", " \t\n"]
DIGITS = ["0", "7", "42", "123", "2024", "31415926535", "1,000", "3.5", "٣٤٥", "१२३"]
PUNCT = [".", ",", "!", "?", "...", "—", "–", "“", "”", "«", "»", "(", ")", "'", "\"", ";",
         ":", "¿", "¡", "。", "、", "！"]


def rand_piece(rng):
    r = rng.random()
    if r < 0.55:
        lang = rng.choice(list(WORDS))
        w = rng.choice(WORDS[lang])
        return w.capitalize() if rng.random() < 0.1 else w
    if r < 0.63:
        return rng.choice(EMOJI)
    if r < 0.72:
        return rng.choice(DIGITS)
    if r < 0.82:
        return rng.choice(PUNCT)
    if r < 0.86:
        return rng.choice(CODE)
    if r < 0.89:
        return rng.choice(LOOKALIKES)
    return rng.choice(SPACES)


def rand_text(rng, n):
    parts = []
    for _ in range(n):
        parts.append(rand_piece(rng))
        parts.append(rng.choice([" ", " ", " ", "", "\n", "  "]))
    return "".join(parts)


def training_corpus():
    rng = random.Random(1)
    lines = []
    for _ in range(6000):
        lines.append(rand_text(rng, rng.randint(3, 40)))
    for lang, ws in WORDS.items():
        for _ in range(100):
            lines.append(" ".join(rng.choice(ws) for _ in range(12)))
    lines.extend(CODE * 30)
    return lines


def test_corpus():
    rng = random.Random(2)
    out = ["", " ", "  ", "\n", "a", "Hello world", "Hello, world!", "  leading", "trailing  ",
           "tabs\tand\nnewlines\r\n", "<|im_start|>user\nhi<|im_end|>\n",
           "text <|im_start|> inside", "<s> not a bos", "partial <|im_ token",
           "<s><s></s>", "a<|endoftext|>b", "<|begin_of_text|>x", "<think>\nfoo\n</think>",
           "hello world", "say hello world now", "xhello worldx", " <mask> ", "a  <mask>  b",
           "<0x41><0x42>", "ſs KELVIN K ß", "İstanbul ıi", "ﬁ ﬂ ﬀ", "① ⅷ ²³", "Ａ１！",
           "𝐀𝐁𝐂 𝟙𝟚", "\u0085next\u2028line\u2029para", "\u200bzero\u200cwidth\u200d",
           "\ufeffbom", "a\u0301e\u0301", "\u1e9b\u0323", "\u00c5\u212b\u0041\u030a",
           "x" * 3 + "\t" * 5 + " " * 7 + "\n" * 3, "1234567890123", "a1b22c333d4444",
           "e" + "\u0301" * 20, "'S 'T 'RE 'Ve 'lL 'D'm", "don't DON'T", "?!?!?!", "…………",
           "\U0010FFFD\U000E0001", "\x01\x02\x7f", "▁ underscore ▁▁x", "   \n   \n",
           "ਪੰਜਾਬੀ தமிழ் ગુજરાતી", "ᐃᓄᒃᑎᑐᑦ ሰላም ქართული Հայերեն",
           # found by differential fuzzing: U+180E is not \s for Oniguruma,
           # circled letters are \w (Alphabetic) for single_word, normalized
           # added tokens decode as their normalized form
           "\u180e's x\u180e<mask> \u180e\u180e\t\t", "hello worldⒿ Ⓗhello world ⓗhello world",
           "ab-cd xab-cd  ab-cd-ab-cd", "\u1680\u2000\u200a\u202f\u205f\u3000 spaces",
           ]
    # NFD forms of accented words
    for lang in ("fr", "de", "es", "el", "ru", "ko"):
        for w in WORDS[lang]:
            out.append(unicodedata.normalize("NFD", w) + " " + w)
    # single pieces of every kind
    for ws in WORDS.values():
        out.extend(ws)
    out.extend(EMOJI + CODE + LOOKALIKES + SPACES + DIGITS + PUNCT)
    # whitespace and digit runs
    for n in (1, 2, 3, 4, 5, 8, 17, 33):
        out.append("a" + " " * n + "b")
        out.append("x" + "\t" * n + "\n" * (n % 3) + "y")
        out.append("9" * n)
        out.append(" " * n)
    # random mixtures
    while len(out) < 2200:
        out.append(rand_text(rng, rng.randint(1, 40)))
    # long words (10,000+ characters)
    out.append("a" * 10000)
    out.append("ab" * 5000 + "c")
    out.append("".join(rng.choice("abcdefghij") for _ in range(12000)))
    out.append("中文" * 5000)
    out.append("😀" * 2600)
    out.append("é" * 10001)
    out.append("1" * 10003)
    out.append(" " * 10000 + "x")
    return out


# --------------------------------------------------------------- tokenizers
def bytelevel_trainer(vocab):
    return trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def make_qwen2(lines):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(lines, bytelevel_trainer(3000))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    cfg = {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
           "chat_template": "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                            "{{ message['content'] }}<|im_end|>\n{% endfor %}"}
    gen = {"eos_token_id": [None, None]}
    return tok, cfg, gen, {"merges_as_strings": True}


def make_llama3(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, bytelevel_trainer(2500))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
           "add_bos_token": True}
    gen = {"bos_token_id": bos, "eos_token_id": [None, None]}
    return tok, cfg, gen, {}


def make_neox(lines):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train_from_iterator(lines, bytelevel_trainer(2000))
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                            AddedToken("<|padding|>", special=True, normalized=False),
                            AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    # GPT-NeoX-style whitespace-run tokens (normalized, not special) and a
    # single-word normalized token.
    tok.add_tokens([AddedToken("  ", normalized=True), AddedToken("   ", normalized=True),
                    AddedToken("\t\t", normalized=True, rstrip=True),
                    AddedToken("hello world", normalized=True, single_word=True),
                    AddedToken("Å", normalized=True)])
    cfg = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": False}
    gen = {"eos_token_id": None}
    return tok, cfg, gen, {}


def sp_vocab(lines):
    """Trains a SentencePiece-like BPE and lays out its vocab as Llama-2 does:
    <unk>, <s>, </s>, <0x00>..<0xFF>, then the learned pieces."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                  split=True)
    trainer = trainers.BpeTrainer(vocab_size=2200, min_frequency=2, show_progress=False,
                                  limit_alphabet=300, special_tokens=["<unk>", "<s>", "</s>"])
    base.train_from_iterator(lines, trainer)
    m = json.loads(base.to_str())["model"]
    learned = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in learned:
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]
    return vocab, merges


def sp_common(tok):
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
           "add_eos_token": False}
    gen = {"bos_token_id": 1, "eos_token_id": 2}
    return cfg, gen


def make_llama2(sp):
    vocab, merges = sp
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    cfg, gen = sp_common(tok)
    return tok, cfg, gen, {}


def make_mixtral(sp):
    vocab, merges = sp
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                     decoders.ByteFallback(), decoders.Fuse()])
    cfg, gen = sp_common(tok)
    return tok, cfg, gen, {}


# gpt-oss (o200k_harmony): tiktoken's special tokens 199998..200018, in that
# order (tiktoken_ext/openai_public.py o200k_harmony; the rest of the range
# up to 201087 are more <|reserved_N|>).
HARMONY_SPECIAL = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>",
                   "<|reserved_200001|>", "<|return|>", "<|constrain|>", "<|reserved_200004|>",
                   "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|reserved_200009|>",
                   "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>",
                   "<|reserved_200013|>", "<|reserved_200014|>", "<|reserved_200015|>",
                   "<|reserved_200016|>", "<|reserved_200017|>", "<|endofprompt|>"]

# Strings that exercise the o200k and DeepSeek-V3 regexes beyond the shared
# corpus: case runs (Lu/Lt/Lm/Lo/Ll), marks, contractions after words,
# slashes after punctuation, CJK and kana runs next to other text, ASCII
# punctuation before letters.
REGEX_EXTRA = [
    "camelCaseWord PascalCase HTTPServer iPhone XMLHttpRequest getHTTPResponseCode",
    "ǅungla ǈubljana Ǌ ǋ ᾈ ᾉ ᾼ titlecase", "ʰʲʷ ˢ ꜰ ᵃᵇ ﾞﾟ modifier", "ǅǅǅ aǅb Aǅ ǅA",
    "e\u0301 A\u0301B \u0301x ab\u0301\u0302C \u20dd\u20dd", "ǀǁǂ ƻ ª º",
    "HELLO'S hello's Hello'Re they'VE I'M we'll he'D x'll 'll 'S", "ſ'ſ 'ſ K'K ǅ's",
    "a/b/c\n// path/to/file\r\n ./x ../y /// \\n", "x = y;\n\n// comment\n/* c */\n",
    "?!/\n\n/ !/\r/ ,/a", "1234567 12 1 ١٢٣٤ ½¾ ²³ Ⅻ ⅻ ① 𝟙𝟚𝟛",
    "日本語のテキストとカタカナ、ひらがな。漢字123", "ｶﾀｶﾅ ｱｲｳ halfwidth", "ー〆々〇 ゝゞヽヾ",
    "\u3040\u3097\u30a0\u30ff\u9fa5\u9fa6\u9fff\u4dff\u3400", "ㇰㇱ ㄅㄆ 가나 ｧ",
    "中文English混合123456テスト", "鑫龘 𠀀𠀁 𪚥", ".NET #include @user $var %d ^x ~y `z` |p",
    "foo.bar() a.b ...abc !!!Hello ''quoted'' \"dq\" [x] {y} <z> \\w \\\\n",
    "end.\n\nNext line.\r\n\tIndented:\n  - item", "x;\r\n\r\ny", ") \n\n\n(",
    "¡Hola! ¿Qué? «guillemets» “curly” ‘single’ — dash – en … ellipsis",
    "€100 $5 £3 ¥7 ₹9 ±1 ×2 ÷3 ≤4 ≥5 ∑ ∞ ° © ® ™", "😀abc 🤖x 👍🏽y ❤️z #️⃣1",
    "  leading and trailing  \t", "\u00a0\u00a0nbsp\u2003em\u3000ideographic",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３",
    "Ελληνικά ΚΕΦΑΛΑΙΑ Россия МОСКВА Ёлка Ǆemal", "ﬁnancial ﬂow ß ẞ İı",
    "क्षत्रिय ह्‍ न्‌ 𑀓𑀸", "مرحباً بالعالم", "ab\u200dcd \u200c\u200b x",
]
HARMONY_EXTRA = [
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>",
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, "
    "final. Channel must be included for every message.<|end|><|start|>user<|message|>What's "
    "2+2?<|end|><|start|>assistant<|channel|>analysis<|message|>Simple arithmetic.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2+2 = 4.<|return|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    "<|message|>{\"location\":\"Tokyo\"}<|call|>",
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    "{\"sunny\": true, \"temperature\": 20}<|end|>",
    "<|startoftext|>x<|endoftext|>", "<|reserved_200013|><|endofprompt|><|reserved_200017|>",
    "<|start|><|start|><|end|>", "a<|message|>b<|message|>c", " <|end|> ", "<|end|>\n",
    "<|start", "start|>", "<| start|>", "<|START|>", "<|end |>", "<|reserved_200999|>",
    "<|reserved_20001|>", "<|im_start|>user", "<|<|start|>|>", "<|start|>>",
]
DEEPSEEK_EXTRA = [
    "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hi, who are you?"
    "<｜Assistant｜><think>\nThe user greets me.\n</think>\n\nHello! I am DeepSeek."
    "<｜end▁of▁sentence｜>",
    "<｜User｜>1+1=?<｜Assistant｜><think>\n</think>\n\n2<｜end▁of▁sentence｜><｜User｜>",
    "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>x", "<｜end▁of▁sentence｜><｜▁pad▁｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "<｜fim▁begin｜>def f():\n    <｜fim▁hole｜>\n    return x<｜fim▁end｜>",
    "<｜place▁holder▁no▁0｜><｜place▁holder▁no▁3｜> <|EOT|>", "<think></think>",
    "<think>思考：日本語のテキスト</think>答え", "a<think>b</think>c", " <think> ",
    "<|begin▁of▁sentence|>", "<｜begin_of_sentence｜>", "<｜begin▁of▁sentence", "｜end▁of▁sentence｜>",
    "<｜User｜", "<｜user｜>", "<THINK>", "<think >", "</think", "▁of▁ ｜ ｜｜ <｜｜>",
    "<｜place▁holder▁no▁9｜>",
]


def make_gptoss(lines):
    """gpt-oss's tokenizer.json as transformers' TikTokenConverter writes it
    for o200k_harmony: Split(o200k regex, Isolated) + ByteLevel(no prefix
    space, no regex), ignore_merges, ByteLevel decoder and post-processor,
    no normalizer; the harmony special tokens."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(lines, bytelevel_trainer(3000))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIAL])
    # gpt-oss's tokenizer_config.json and generation_config.json
    cfg = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
           "clean_up_tokenization_spaces": False}
    gen = {"bos_token_id": tok.token_to_id("<|startoftext|>"),
           "eos_token_id": ["<|return|>", "<|endoftext|>", "<|call|>"],
           "pad_token_id": tok.token_to_id("<|endoftext|>")}
    return tok, cfg, gen, {"extra": REGEX_EXTRA + HARMONY_EXTRA, "transformers": True}


def make_deepseek3(lines):
    """DeepSeek-V3's tokenizer.json: an empty normalizer Sequence,
    Sequence[Split(digits), Split(CJK and kana runs), Split(main regex),
    ByteLevel]; BOS/EOS/pad at ids 0..2 (in the vocab, as the trainer puts
    them), placeholder and chat tokens after the vocab, <think>/</think> as
    DeepSeek-R1 has them; TemplateProcessing(BOS $A), and tokenizer_config's
    add_bos_token with LlamaTokenizerFast, which builds the same template."""
    def tk(t, special):
        return AddedToken(t, special=special, normalized=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(DS3_DIGITS_RE), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(DS3_CJK_RE), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(DS3_MAIN_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[tk(bos, True), tk(eos, True),
                                                  tk("<｜▁pad▁｜>", True)])
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens([tk("<｜place▁holder▁no▁%d｜>" % i, True) for i in range(4)])
    tok.add_tokens([tk(t, False) for t in ("<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
                                           "<｜User｜>", "<｜Assistant｜>")])
    tok.add_special_tokens([tk("<|EOT|>", True)])
    tok.add_tokens([tk(t, False) for t in ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                           "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                                           "<｜tool▁sep｜>", "<think>", "</think>")])
    tok.post_processor = processors.TemplateProcessing(
        single=bos + ":0 $A:0", pair=bos + ":0 $A:0 " + bos + ":1 $B:1",
        special_tokens=[(bos, tok.token_to_id(bos))])

    def cfg_token(t):
        return {"__type": "AddedToken", "content": t, "lstrip": False, "normalized": True,
                "rstrip": False, "single_word": False}
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": cfg_token(bos),
           "clean_up_tokenization_spaces": False, "eos_token": cfg_token(eos), "legacy": True,
           "pad_token": cfg_token(eos), "unk_token": None, "tokenizer_class": "LlamaTokenizerFast"}
    gen = {"bos_token_id": tok.token_to_id(bos), "eos_token_id": tok.token_to_id(eos)}
    return tok, cfg, gen, {"extra": REGEX_EXTRA + DEEPSEEK_EXTRA, "transformers": True}


def expected_entry(s, ids, text):
    """The decoded text is stored only where it differs from the input: as
    "text_prefix" when it is the input after some prefix (a BOS), else as
    "text"."""
    if text == s:
        return {"ids": ids}
    if len(text) > len(s) and text.endswith(s):
        return {"ids": ids, "text_prefix": text[:len(text) - len(s)]}
    return {"ids": ids, "text": text}


def make_misc_a(lines):
    """Pieces no supported family uses today, checked anyway: NFKC,
    Lowercase, Strip, WhitespaceSplit, Punctuation, Digits(individual),
    subword prefix/suffix, Roberta post-processor, Replace/Strip decoders."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                           normalizers.Strip(left=True, right=True)])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.Sequence([decoders.Replace("</w>", " "), decoders.Replace("##", ""),
                                     decoders.Strip(" ", 0, 1)])
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False,
                                  limit_alphabet=400, continuing_subword_prefix="##",
                                  end_of_word_suffix="</w>",
                                  special_tokens=["[UNK]", "[CLS]", "[SEP]"])
    tok.train_from_iterator(lines, trainer)
    tok.post_processor = processors.RobertaProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                      ("[CLS]", tok.token_to_id("[CLS]")))
    return tok, {"bos_token": "[CLS]", "eos_token": "[SEP]"}, {}, {}


def make_misc_b(lines):
    """More splitting behaviours: NFD + Replace(regex) accent stripping,
    Whitespace, Split with every behaviour and invert, Digits(contiguous),
    Metaspace(always, split) and its decoder, no post-processor."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(),
                                           normalizers.Replace(Regex(r"\p{Mn}"), ""),
                                           normalizers.Prepend("^")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[0-9]"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"x+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="merged_with_next", invert=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Metaspace(replacement="_", prepend_scheme="always", split=True)])
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="_", prepend_scheme="always"),
                                     decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  limit_alphabet=300, special_tokens=["<unk>"])
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens([AddedToken("<sep>", special=True, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("ab-cd", normalized=True, lstrip=True)])
    return tok, {}, {}, {}


def save(name, tok, cfg, gen, opts, corpus):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    j = json.loads(tok.to_str())
    if opts.get("merges_as_strings"):
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
    tok = Tokenizer.from_file(path)  # what the C side reads
    eos = cfg.get("eos_token")
    if isinstance(eos, dict):  # {"__type": "AddedToken", "content": ...}
        eos = eos["content"]
    cfg = dict(cfg, tokenizer_class=cfg.get("tokenizer_class", "PreTrainedTokenizerFast"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    ge = gen.get("eos_token_id")
    if isinstance(ge, list) and all(isinstance(t, str) for t in ge):
        gen["eos_token_id"] = [tok.token_to_id(t) for t in ge]
    elif isinstance(ge, list):
        gen["eos_token_id"] = [tok.token_to_id(eos), tok.token_to_id("<|endoftext|>")
                               or tok.token_to_id("<|eot_id|>")]
    elif "eos_token_id" in gen or eos:
        gen["eos_token_id"] = tok.token_to_id(eos)
    with open(os.path.join(d, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=1)
    # Strings for this folder only, checked after the shared corpus.
    extra = opts.get("extra", [])
    if extra:
        with open(os.path.join(d, "extra.json"), "w", encoding="utf-8") as f:
            json.dump(extra, f, ensure_ascii=False, indent=0)
    exp = []
    for s in corpus + extra:
        ids = tok.encode(s, add_special_tokens=True).ids
        exp.append(expected_entry(s, ids, tok.decode(ids, skip_special_tokens=False)))
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(exp, f, ensure_ascii=False, separators=(",", ":"))
    if opts.get("transformers"):
        check_transformers(d, corpus + extra, exp)
    print(name, "vocab", tok.get_vocab_size(), "ids", sum(len(e["ids"]) for e in exp))


def check_transformers(d, strings, exp):
    """The folder as transformers loads it (tokenizer.json read with
    tokenizer_config.json, as AutoTokenizer does for a model) gives the same
    ids and text as the tokenizers package: the expected files describe
    what a transformers user of the model gets."""
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(d)
    bad = 0
    for s, e in zip(strings, exp):
        ids = t.encode(s, add_special_tokens=True)
        text = t.decode(ids, skip_special_tokens=False)
        want = e.get("text", e.get("text_prefix", "") + s)
        if ids != e["ids"] or text != want:
            bad += 1
            if bad <= 3:
                print("  transformers differs on %r: %s / %r" % (s[:60], ids[:20], text[:60]))
    if bad:
        raise SystemExit("%s: transformers differs from tokenizers on %d strings" % (d, bad))
    print("  transformers (%s) agrees on %d strings" % (type(t).__name__, len(strings)))


def expected_for(tokenizer_json, out_path, corpus):
    """Reference ids/text for a real tokenizer.json, for checking one that is
    too large to commit (see test_tokenizer.c, MOERUN_TOKENIZER_CHECK_DIR).
    An extra.json next to it (a list of strings) is checked after the
    corpus, as in the fixture folders."""
    tok = Tokenizer.from_file(tokenizer_json)
    extra = os.path.join(os.path.dirname(tokenizer_json), "extra.json")
    if os.path.exists(extra):
        with open(extra, encoding="utf-8") as f:
            corpus = corpus + json.load(f)
    exp = []
    for s in corpus:
        ids = tok.encode(s, add_special_tokens=True).ids
        exp.append(expected_entry(s, ids, tok.decode(ids, skip_special_tokens=False)))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(exp, f, ensure_ascii=False, separators=(",", ":"))


def main():
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--check-dir":
        # python3 make_tokenizer_fixtures.py --check-dir MODEL_DIR
        # writes MODEL_DIR/expected.json for MODEL_DIR/tokenizer.json
        d = sys.argv[2]
        expected_for(os.path.join(d, "tokenizer.json"), os.path.join(d, "expected.json"),
                     test_corpus())
        return
    # python3 make_tokenizer_fixtures.py [NAME...]: only those folders
    only = set(sys.argv[1:])
    lines = training_corpus()
    corpus = test_corpus()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(corpus, f, ensure_ascii=False, indent=0)
    sp = sp_vocab(lines)
    makers = (("qwen2", lambda: make_qwen2(lines)), ("llama3", lambda: make_llama3(lines)),
              ("neox", lambda: make_neox(lines)), ("llama2", lambda: make_llama2(sp)),
              ("mixtral", lambda: make_mixtral(sp)), ("misc_a", lambda: make_misc_a(lines)),
              ("misc_b", lambda: make_misc_b(lines)), ("gptoss", lambda: make_gptoss(lines)),
              ("deepseek3", lambda: make_deepseek3(lines)))
    unknown = only - {name for name, _ in makers}
    if unknown:
        raise SystemExit("unknown fixture folder(s): " + ", ".join(sorted(unknown)))
    for name, mk in makers:
        if not only or name in only:
            save(name, *mk(), corpus)


if __name__ == "__main__":
    main()
