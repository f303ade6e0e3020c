"""Data for pretraining and SFT (report section 3): tokenizers, document sources, packing, grain pipelines.

  tokenizer.py       Tokenizer protocol, HFTokenizer (tokenizer.json), make_tokenizer("byte" | path)
  byte_tokenizer.py  the default: 256 bytes + PAD, BOS, EOS
  sources.py         source dicts -> grain MapDatasets of documents; the SOURCES registry of kinds
  stdlib_corpus.py   the Python standard library's sources, split train / heldout by path hash
  sft.py             chat demonstrations of the coding suites' reference solutions
  packing.py         tokenize, cut into pieces of <= T, first-fit pack, the batch format
  window_shuffle.py  a seeded windowed shuffle with an exact, JSON state
  pipeline.py        lm_dataset (mixed, sharded, shuffled, resumable batches) and eval_batches
"""
