"""A machine profile fitted from measurements, and the step-time prediction it feeds.

``paritybench calibrate`` measures (``sweep``) or reads a run folder's calibration rows, fits the α–β
model per collective and group size, point-to-point costs and compute rates (``fit``), and writes a
``Profile`` (``profile``). ``predict`` turns a profile and a layout into a predicted step time with its
parts; ``paritybench plan --profile`` ranks layouts by it, and ``bench 3d`` / ``bench pipeline`` write
it beside each measurement (``report``: predicted vs measured).
"""
