"""Method colours (report/palette.py): fixed per name, distinct for the papers' methods, never grey."""

from fedshift.report.palette import KNOWN, method_colour


def test_known_methods_get_distinct_non_grey_colours():
    colours = [method_colour(m)[:3] for m in KNOWN]
    assert len(set(colours)) == len(KNOWN)  # no two of the papers' methods share a colour
    for m, (r, g, b) in zip(KNOWN, colours):
        assert max(r, g, b) - min(r, g, b) >= 0.02, m  # grey is the grid's and the bands' colour
    # FedH2L's Table II figure: fedh2l, ind, agg, fedmd, fedh2l_async are told apart
    table2 = [method_colour(m)[:3] for m in ("fedh2l", "ind", "agg", "fedmd", "fedh2l_async")]
    assert len(set(table2)) == 5


def test_any_name_keeps_its_colour():
    assert method_colour("fedh2l_seedlocal") == method_colour("fedh2l_seedlocal")
    assert method_colour("base (federated schedule)") == method_colour("base")
