"""bench/builtin_resources.py without compiling: its grid reaches every backend and kernel the built-in choice has on
sm_90, and each variant carries the shapes that choose it."""


def test_the_grid_reaches_every_kernel_of_the_built_in_choice_on_sm90(bench_tool):
    choices = bench_tool("builtin_resources").builtin_choices("sm_90")
    names = set(choices)
    for part in ("mla_decode_sm90", "mla_decode_sm80", "gqa_decode_sm90", "gqa_decode_sm80", "_keysm_", "_seesaw_",
                 "kvfp8_dsmla", "kvfp8_sb64", "kvbf16"):
        assert any(part in n for n in names), part
    for name, (cfg, shapes) in choices.items():
        assert shapes and all(("MLA" in s) == (cfg.family == "mla_decode") for s in shapes), name
    # one variant may serve many shapes (e.g. every split count of an sm80 launch), never the reverse
    assert sum(len(s) for _, s in choices.values()) > len(choices)


def test_off_sm90_the_choice_is_the_sm80_backend_only(bench_tool):
    choices = bench_tool("builtin_resources").builtin_choices("sm_89")
    assert choices and all("_sm80_sm89_" in n for n in choices)
