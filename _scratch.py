if __name__ == "__main__":
    from harness.runtime.world import World
    from harness.stack.judge import judged
    from harness.localise import Case, localise
    from suites.stack.test_lr_schedule import CASES
    c = CASES[0]
    w2, w1 = World(2).__enter__(), World(1).__enter__()
    get = {1: w1, 2: w2}.get
    v = judged(w2, "suites.stack.planted:ScheduleOneAhead", c[1], c[2], c[3], one=lambda: w1, padded=True, steps=4)
    loc = localise(get, "suites.stack.planted:ScheduleOneAhead", Case(c[1], c[2], c[3], 4, True), judged, v["problems"])
    print("\n".join(loc.lines()))
