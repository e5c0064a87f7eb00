"""Data: from files on disk to the batches a model trains on.

- The real data sets, each with its loader and its splits: Multi30k
  (:mod:`~qkv.data.translation`), text corpora for language models (:mod:`~qkv.data.text`,
  :mod:`~qkv.data.lm`), protein corpora and labelled protein tasks
  (:mod:`~qkv.data.protein`, :mod:`~qkv.data.protein_tasks`), CDR-H3 of antibodies
  (:mod:`~qkv.data.cdr`), deep mutational scans (:mod:`~qkv.data.dms`), protein structures
  (:mod:`~qkv.data.structures`), SST-2 and labelled sentences (:mod:`~qkv.data.text_tasks`),
  images (:mod:`~qkv.data.images`), captioned scenes and emoji (:mod:`~qkv.data.scenes`,
  :mod:`~qkv.data.emoji`), and a user's own parallel pairs (:mod:`~qkv.data.parallel`).
- Where their files come from (:mod:`~qkv.data.sources`: the data directory, the user cache,
  else a download checked against its checksum).
- The tokenizers (:mod:`~qkv.data.tokenizers`: qkv's BPE, characters, a pretrained model's own
  vocabulary, amino acids, a pretrained protein vocabulary), behind one interface.
- Batching: token-count batches bucketed by length (:mod:`~qkv.data.batching`, §5.1), masked
  language-model corruption (:mod:`~qkv.data.masking`) and its protein batches
  (:mod:`~qkv.data.protein_mlm`).
- Corpora bigger than memory: tokenized once by :mod:`~qkv.data.prepare` (``qkv prepare``) into
  token shards that :mod:`~qkv.data.shards` writes and reads back on demand.

The training loop, the run directories and the recipes read it; it imports none of them (its
layer sits below theirs: ``tests/test_imports.py``).
"""
