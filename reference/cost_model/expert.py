"""Expert parallelism's bytes per rank and layer (``reference.expert_parallel``), from the actual routing.

With ``send[j]`` the (token, slot) assignments this rank sends to EP rank j and ``recv[j]`` those it receives
from j (its own EP rank's stay local), h hidden, e bytes per element:
- forward: the counts (one int64 to each other EP rank: 8 (ep - 1)), the expert ids of the rows sent (8 per
  row), the dispatch (sum_{j != me} send[j] h e) and the combine sending the outputs back (sum_{j != me}
  recv[j] h e);
- backward: the combine's gradients go to the experts (the sent rows' count again) and the dispatch's come
  back (the received rows' count).
Balanced routing (every EP rank sends T k / ep assignments to each): ``balanced_ep_bytes`` — T k h e
(ep - 1) / ep per all-to-all, two each way. The load-balancing loss's two all-reduces (E + 1 float64 over the
group) are not EP's and not counted here."""

from __future__ import annotations

from ._checks import whole


def ep_layer_comm_bytes(send: list[int], recv: list[int], rank: int, hidden: int, element_size: float = 2) -> dict:
    """{"forward", "backward", "total"} bytes EP rank ``rank`` sends for one layer (see the docstring)."""
    ep = len(send)
    if len(recv) != ep or not 0 <= rank < ep:
        raise ValueError(f"send and recv must have one count per EP rank and rank must be one of them; got "
                         f"{len(send)}, {len(recv)} counts and rank {rank}.")
    whole("hidden", hidden)
    out_rows, in_rows = sum(send) - send[rank], sum(recv) - recv[rank]
    forward = 8 * (ep - 1) + 8 * out_rows + (out_rows + in_rows) * hidden * element_size
    backward = (out_rows + in_rows) * hidden * element_size
    return {"forward": forward, "backward": backward, "total": forward + backward}


def balanced_ep_bytes(tokens: int, top_k: int, hidden: int, ep: int, element_size: float = 2) -> dict:
    """The dispatch and combine bytes of balanced routing: tokens x top_k x hidden x e x (ep - 1) / ep per
    all-to-all, dispatch and combine forward, the same two backward (the counts and ids not included)."""
    for name, value in (("tokens", tokens), ("top_k", top_k), ("hidden", hidden), ("ep", ep)):
        whole(name, value)
    one = tokens * top_k * hidden * element_size * (ep - 1) / ep
    return {"forward": 2 * one, "backward": 2 * one, "total": 4 * one}


def expert_params(layers: int, experts: int, hidden: int, ffn: int) -> float:
    """Routed experts' parameters of a model: ``layers`` x E SwiGLU experts of 3 hidden x ffn each."""
    for name, value in (("layers", layers), ("experts", experts), ("hidden", hidden), ("ffn", ffn)):
        whole(name, value)
    return float(layers * experts * 3 * hidden * ffn)
