"""What upstream said about each fix after it shipped, by patch id.

A dated record, read by hand from the upstream threads (the date is when it
was read; a status may have changed since). Each patch module takes its
entry as ``follow_ups``; `list`, `status`, their JSON and the SBOM show them.
Each entry's ``headline`` is the consequence in one line (at most
``HEADLINE_MAX`` characters, never cut), for the places a person decides;
``summary`` is the whole sentence. Add an entry when upstream reports a
problem with a fix, proposes it again, or changes the code it touched. A
later upstream change that repairs what a carried fix broke is not a
follow-up but a patch of the series, named in the fix's ``companions``
(vllm#49397 for vllm#43617).
"""

from __future__ import annotations

from deepstack_patch.engine.protocol import FollowUp

FOLLOW_UPS: dict[str, tuple[FollowUp, ...]] = {
    "vllm#40917": (
        FollowUp(
            "vllm#49094",
            "open",
            "2026-11-23",
            "A pull request by this fix's author, under the same title, proposes "
            "the same [:n] slice of Granite4Vision's deepstack buffers again (13 "
            "to about 63 tokens/s decode); the releases in targets.toml up to "
            "0.33.0 still carry this fix's slice.",
            "upstream proposes this same slice again; 0.33.0 still carries it",
        ),
    ),
    "vllm#43617": (
        FollowUp(
            "vllm#53516",
            "closed",
            "2026-11-23",
            "Reports that this fix's removal of the `num_tokens == 0` early "
            "return in _get_deepstack_input_embeds costs Qwen3-VL-2B 27 points "
            "on an image people-detection task under torch.compile, measured "
            "with the official v0.20.2 and v0.27.1 images and v0.27.1 with that "
            "line restored.",
            "reported: Qwen3-VL-2B 27 points less accurate under torch.compile",
        ),
        FollowUp(
            "vllm#44384",
            "open",
            "2026-11-23",
            "Proposes recreating the buffers when their size, device or dtype "
            "differs from the step's, because the zero-backed buffers this fix "
            "returns can still be on their initial device and dtype (CPU, "
            "float32) in text- or audio-only profiling of Qwen3-VL and Qwen3-Omni.",
            "the buffers can stay CPU float32 in text- or audio-only profiling",
        ),
    ),
}
