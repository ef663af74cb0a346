"""Every measured table in the docs is rendered from the committed run records (issue 52): re-render the
generated blocks of README.md and docs/*.md from records/ and fail where a block's text differs (a number
typed by hand, a record added without `fedshift docs-tables`, or a record the grid no longer matches)."""

from __future__ import annotations

from conftest import REPO
from fedshift.archive.docs import BLOCK, check_or_write, doc_files

# The blocks the docs must keep (a deleted block would hide its numbers' source): kind + grid files.
EXPECTED = {
    "docs/fedh2l.md": ["table params/papers/fedh2l_table2.yaml params/papers/fedh2l_table2_seedlocal.yaml",
                       "claims params/papers/fedh2l_table2.yaml params/papers/fedh2l_table2_seedlocal.yaml "
                       "ids=fedh2l_more_public_better,fedh2l_gt_agg_ind,fedh2l_gt_fedmd,fedh2l_gt_fedavg_a15 "
                       "shared=agg,fedmd,fedavg,fedprox"],
    "docs/tuning.md": ["tuned params/papers/tuned_digits_offline.yaml", "table params/papers/tuned_digits_offline.yaml",
                       "tuned params/papers/fedmmd_offline.yaml", "table params/papers/fedmmd_offline.yaml"],
    "docs/methods.md": ["table params/papers/current_baselines_offline.yaml"],
    "docs/fccl.md": ["table params/papers/fccl_table3_offline.yaml"],
    "README.md": ["table params/ablations/engine_defaults.yaml"],
}


def test_docs_keep_their_generated_blocks():
    for name, heads in EXPECTED.items():
        found = [m.group("head") for m in BLOCK.finditer((REPO / name).read_text())]
        assert set(heads) <= set(found), f"{name}: generated blocks {sorted(set(heads) - set(found))} are gone"


def test_every_generated_block_equals_its_rendering_from_the_committed_records(monkeypatch):
    monkeypatch.chdir(REPO)  # the blocks name grid files relative to the repository, as the workflow does
    changed = check_or_write([p.relative_to(REPO) for p in doc_files(REPO)], REPO / "records", write=False)
    assert not changed, ("generated blocks differ from their records (run `fedshift docs-tables` and commit; never "
                         "edit a generated block by hand):\n" + "\n".join(changed))
