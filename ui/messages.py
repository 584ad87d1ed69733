"""How a conversation looks in the Chatbot: user and assistant bubbles, the thinking channel as a
"Thinking" block (open with a spinner while it streams, collapsed once the answer starts or the turn
ends), and the one-line note under the chat that says what a turn cost. Control characters in any
message are shown as escapes, never obeyed by the page.
"""
from __future__ import annotations

from k3core.generation.channels import visible


def display(messages: list[dict]) -> list[dict]:
    """Conversation messages as Chatbot messages: thinking is a collapsed "Thinking" block."""
    out = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant" and m.get("thinking"):
            out.append({"role": "assistant", "content": visible(m["thinking"]),
                        "metadata": {"title": "Thinking", "status": "done"}})
        if m["role"] == "assistant":
            out.append({"role": "assistant", "content": visible(m.get("content") or "") or
                        ("*(the reply ended while still thinking)*" if m.get("thinking") else "*(no reply)*")})
        elif m["role"] in ("user", "tool"):
            out.append({"role": "user", "content": visible(m["content"])})
    return out


def partial(thinking: str, answer: str, thinking_open: bool) -> list[dict]:
    """The reply being generated: thinking (open while its channel is), then the answer so far."""
    out = []
    thinking, answer = visible(thinking), visible(answer)
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
    reason = {"stop id": "", "cancelled": "stopped", "max tokens": "reached max tokens", "stop string": "stop string",
              "context full": "the conversation filled the context (k3 ui --max-context)"}.get(last.get("reason"), last.get("reason", ""))
    parts = [note] if note else []
    reused, prompt = last["reused_tokens"], last["prompt_tokens"]
    kept = (f"{reused} of the {prompt} prompt tokens were already in this conversation's decode state and were not "
            f"read again; {prompt - reused} new" if reused else f"all {prompt} prompt tokens read")
    parts.append(f"{kept}; {last['generated_tokens']} tokens generated" + (f" ({reason})" if reason else "")
                 + (f"; seed {last['seed']} (the same seed gives the same reply)" if sampled else "; greedy"))
    return " · ".join(parts)
