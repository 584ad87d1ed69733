"""How a conversation looks in the Chatbot: user and assistant bubbles, the thinking channel as a
"Thinking" block (open with a spinner while it streams, collapsed once the answer starts or the turn
ends), and the one-line note under the chat that says what a turn cost.
"""
from __future__ import annotations


def display(messages: list[dict]) -> list[dict]:
    """Conversation messages as Chatbot messages: thinking is a collapsed "Thinking" block."""
    out = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant" and m.get("thinking"):
            out.append({"role": "assistant", "content": m["thinking"],
                        "metadata": {"title": "Thinking", "status": "done"}})
        if m["role"] == "assistant":
            out.append({"role": "assistant", "content": m.get("content") or
                        ("*(the reply ended while still thinking)*" if m.get("thinking") else "*(no reply)*")})
        elif m["role"] in ("user", "tool"):
            out.append({"role": "user", "content": m["content"]})
    return out


def partial(thinking: str, answer: str, thinking_open: bool) -> list[dict]:
    """The reply being generated: thinking (open while its channel is), then the answer so far."""
    out = []
    if thinking:
        out.append({"role": "assistant", "content": thinking,
                    "metadata": {"title": "Thinking…" if thinking_open else "Thinking",
                                 "status": "pending" if thinking_open else "done"}})
    if answer or not thinking:
        out.append({"role": "assistant", "content": answer or "…"})
    return out


def turn_note(note: str, last: dict, sampled: bool = True) -> str:
    """A finished turn in one line: tokens reused from the decode state, forwarded, generated, why it ended
    (and the seed, which reproduces a sampled reply)."""
    reason = {"stop id": "", "cancelled": "stopped", "max tokens": "reached max tokens",
              "stop string": "stop string"}.get(last.get("reason"), last.get("reason", ""))
    parts = [note] if note else []
    parts.append(f"prompt {last['prompt_tokens']} tokens: {last['reused_tokens']} reused from this session's decode "
                 f"state, {last['forwarded_tokens']} forwarded; {last['generated_tokens']} generated"
                 + (f" ({reason})" if reason else "") + (f"; seed {last['seed']}" if sampled else "; greedy"))
    return " · ".join(parts)
