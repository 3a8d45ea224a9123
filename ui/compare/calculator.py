"""The memory calculator: KV bytes per token, and how many tokens and requests fit on a GPU."""

from __future__ import annotations

import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.lab.memory_calc import DEFAULT_BLOCK_SIZES, MODELS, binary_size, kv_capacity
from backend.views.compare import tables
from ui import a11y, layout, numbers
from ui.compare import refuse

# Counts with thousands separators, as the page's text writes them.
COUNT = st.column_config.NumberColumn(format="localized")
# The KV dtype field's choices: bytes per element, as the field and the caption name them.
KV_DTYPES = {2: "fp16 / bf16 (2 bytes)", 4: "fp32 (4 bytes)", 1: "fp8 (1 byte)"}


def calculator_section() -> None:
    st.markdown(
        "Every token keeps a key and a value vector per KV head in every layer: "
        "**bytes per token = 2 x layers x KV heads x head dim x bytes per element**. "
        "What is left of the GPU after the weights and a reserve holds the KV cache.")
    names = list(MODELS)
    with numbers.fields() as f:
        c = st.columns(3)
        name = c[0].selectbox("Model", names, index=names.index("OPT-13B"),
                              key="cmp_calc_model", persist_state="session")
        gpu = f.number(c[1], "GPU memory (GiB)", 1.0, 4096.0, 40.0, step=8.0,
                       key="cmp_calc_gpu")
        bits = c[2].selectbox("Weight precision", [16, 8, 4], key="cmp_calc_bits",
                              persist_state="session",
                              format_func=lambda b: {16: "16-bit (fp16/bf16)", 8: "8-bit",
                                                     4: "4-bit"}[b])
        c = st.columns(3)
        kv_bytes = c[0].selectbox("KV dtype", [2, 4, 1], key="cmp_calc_kv", persist_state="session",
                                  format_func=KV_DTYPES.__getitem__)
        # A share, not GiB: said by its label and help (40 GiB at 0.10 keeps 4 GiB).
        reserve = c[1].slider("Reserve (share of GPU memory)", 0.0, 0.5, 0.1, 0.01,
                              key="cmp_calc_reserve", persist_state="session",
                              help="The share of the GPU's memory kept for activations and "
                                   "the runtime, neither weights nor KV cache: 0.10 of 40 "
                                   "GiB keeps 4 GiB.")
        req_len = f.number(c[2], "Request length (tokens)", 1, 1_000_000, 2048,
                           key="cmp_calc_len")
    model = MODELS[name]
    per_token = model.kv_bytes_per_token(int(kv_bytes))
    # Read out when a field's change redraws it (ui/a11y.py), as are the metrics below.
    a11y.said("cmp_calc", "result").markdown(
        f"**{name}**: 2 x {model.num_layers} layers x {model.num_kv_heads} KV heads x "
        f"{model.head_dim} x {counted(int(kv_bytes), 'byte')} = **{per_token:,} bytes per "
        f"token ({binary_size(per_token)})**"
        + (" - the paper's 800 KB per token." if per_token == 819_200 else "."))
    window = tables.window_note(model, int(req_len))
    if window:      # a sliding window: the formula counts more than such an engine keeps
        st.caption(window)
    # Whether layers share a block or each has its own changes the bytes of one block,
    # not the bytes per token: the table below counts a block across every layer.
    per_layer = per_token // model.num_layers
    st.caption(f"The figures below count a block across all {model.num_layers} layers. "
               "Engines such as vLLM keep one K/V tensor per layer, so a block id names a "
               f"slice in each: {per_layer:,} bytes per token per layer, "
               f"{16 * per_layer:,} bytes for a 16-token block in each layer.")
    try:
        cap = kv_capacity(model, float(gpu), weight_bits=int(bits), kv_dtype_bytes=int(kv_bytes),
                          reserve_fraction=float(reserve), request_len=int(req_len),
                          block_sizes=DEFAULT_BLOCK_SIZES)
    except PagedLabError as e:
        refuse(e)
    else:
        # Two metrics a line where the page is narrow (beside the sidebar in a 1024 px
        # window): four in a row cut the last one's label ("Requests of 2,048 t...").
        layout.wrap_below("cmp_calc_metrics", [200, 200, 200, 200])
        with a11y.said("cmp_calc_fit", "result"), st.container(key="cmp_calc_metrics"):
            m = st.columns(4)
        m[0].metric("Weights", binary_size(cap.weight_bytes))
        m[1].metric("Left for KV", binary_size(cap.kv_bytes))
        m[2].metric("KV tokens that fit", f"{cap.kv_tokens:,}")
        m[3].metric(f"Requests of {counted(cap.request_len, 'token')}", f"{cap.requests:,}",
                    help="KV tokens that fit ÷ request length, slot-exact: no rounding to "
                         "blocks (the caption below and the table give it in blocks).")
        st.caption(tables.fit_note(cap))
        blocks = tables.capacity_blocks_frame(cap)
        # Short headers, the long names as tooltips: every column fits beside the sidebar
        # in a 1024 px window.
        num = st.column_config.NumberColumn
        st.dataframe(blocks, hide_index=True, key="cmp_calc_blocks",
                     column_config={
                         "block size": num("block", help="block size (tokens per block)",
                                           pinned=True),
                         "bytes per block": num("bytes/block", format="localized",
                                                help="KV bytes per block, all layers"),
                         "blocks": COUNT, "KV tokens": COUNT,
                         "blocks per request": num("blocks/req", format="localized",
                                                   help="blocks one request of this length "
                                                        "takes"),
                         "requests that fit": num("requests", format="localized",
                                                  help="requests of this length that fit"),
                         "tail waste per request (slots)": num(
                             "tail waste", help="slots left empty in a request's last block")})
    st.header("Model shapes", anchor=False)
    # Every model in view, and short headers (the long name as each one's tooltip), so
    # the source column fits a 1400 px window beside the sidebar; in a narrower one the
    # grid scrolls sideways with the model's name pinned in view. The shape and its
    # bytes come first, so that beside the sidebar in a 1024 px window they are in view
    # before it scrolls.
    models = tables.models_frame(int(kv_bytes))
    st.dataframe(models, hide_index=True, key="cmp_calc_models",
                 height="content", column_order=[
                     "model", "layers", "query heads", "KV heads", "head dim", "per token",
                     "per 16-token block", "bytes per token", "parameters (B)", "source"],
                 column_config={
                     "model": st.column_config.TextColumn(pinned=True),
                     "query heads": st.column_config.NumberColumn("Q heads",
                                                                  help="query heads"),
                     "parameters (B)": st.column_config.NumberColumn(
                         "params (B)", help="parameters, in billions"),
                     "bytes per token": st.column_config.NumberColumn(
                         "bytes/token", help="KV bytes per token", format="localized"),
                     "per 16-token block": st.column_config.TextColumn(
                         "16-token block", help="KV bytes per block of 16 tokens"),
                     "source": st.column_config.TextColumn(
                         help="the Hugging Face repository whose config.json gave the shape")})
    # The byte columns follow the KV dtype above: said, since the paper's 800 KB per token
    # (OPT-13B) is for 2 bytes, and at fp8 the table reads 400 KiB.
    st.caption(f"KV bytes at the KV dtype chosen above, {KV_DTYPES[int(kv_bytes)]}. "
               "Shapes from each model's Hugging Face config.json. Grouped-query attention "
               "(fewer KV heads than query heads) is why current models need far less KV "
               "memory per token than OPT-13B. " + tables.windowed_models_note())
