"""Method colours (report/palette.py): a qualitative palette in the grid's method order, never grey, one
method one colour in every figure of a report (issue 50: a CRC32 of the name gave a plugin MOON's colour
and hid FedAvg under FedAvgM)."""

from fedshift.report.palette import method_colours, palette


def test_a_grids_methods_get_distinct_non_grey_colours_in_its_order():
    grid = ["fedavg", "fedavgm", "fedprox", "moon", "fpl", "fedheal", "my_plugin", "fccl_plus", "fedmd", "fedh2l",
            "ind", "agg", "fedh2l_async", "rhfl"]
    colours = method_colours(grid, grid)
    rgb = [colours[m][:3] for m in grid]
    assert len(set(rgb)) == len(grid)  # fedavg vs fedavgm, a plugin next to moon: all told apart
    for m, (r, g, b) in zip(grid, rgb):
        assert max(r, g, b) - min(r, g, b) >= 0.02, m  # grey is the grid's and the bands' colour
    assert [colours[m] for m in grid[:9]] == palette()[:9]  # the grid's order takes the palette's order


def test_a_method_keeps_its_colour_whatever_a_figure_shows():
    grid = ["fedavg", "fedavgm", "moon"]
    whole = method_colours(grid + ["base_pretrain"], grid)
    assert method_colours(["moon"], grid)["moon"] == whole["moon"]  # a figure of one method: its colour still
    assert method_colours(["base_pretrain", "fedavgm"], grid) == {m: whole[m] for m in ("base_pretrain", "fedavgm")}
    assert whole["base_pretrain"] not in [whole[m] for m in grid]  # a row the grid does not list: the next colour
    assert method_colours(["base (federated schedule)"], ["fedavg", "base"]) == {
        "base (federated schedule)": method_colours(["base"], ["fedavg", "base"])["base"]}
