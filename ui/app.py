"""The Gradio Blocks of `k3 ui`: the Chat tab with the live engine panel beside it, then Setup, Memory
and Plugins. Handlers stay thin: conversations live in ui/chat.py, the engine in ui/host.py, the
panel in ui/engine_panel.py. Engine-bound events share one concurrency slot ("engine") and the
bounded queue shows each waiting tab its position; everything else runs at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from k3core import K3Error, SamplingParams
from k3core.format.notes import model_note
from k3core.units import human

from .chat import Chats
from .engine_panel import Monitor
from .guard import Guard
from .host import EngineHost
from .inputs import check_inputs, refuse, shown
from .messages import turn_note
from .session import session_key
from .setup_tab import setup_tab
from .plan_picture import CSS as PLAN_CSS
from .tabs import memory_tab, plugins_markdown, plugins_tab

ENGINE = {"concurrency_limit": 1, "concurrency_id": "engine"}  # one forward pass at a time, all tabs
FREE = {"concurrency_limit": None}                               # never waits for the engine

CSS = """
#k3-title h1 { margin-bottom: 0; }
#k3-note { min-height: 1.5em; font-size: 0.85em; opacity: 0.8; }
.k3-panel, .k3-panel tr { border: none !important; }
.k3-panel { width: 100%; font-size: 0.86em; border-collapse: collapse; }
.k3-panel th, .k3-panel td { border: none !important; border-bottom: 1px solid var(--border-color-primary) !important;
  padding: 4px 8px 4px 0 !important; text-align: left; vertical-align: top; background: none !important; }
.k3-panel th { font-weight: 600; white-space: nowrap; width: 9.5em; }
.k3-panel td { font-variant-numeric: tabular-nums; }
.k3-panel progress { width: 100%; height: 0.7em; }
.k3-off { font-size: 0.85em; opacity: 0.85; }
#k3-chat .placeholder-content { padding: 0 1em; }
/* the memory plan's lines are long: wrapped in a narrow window, never cut off behind a scroll bar */
#k3-plan pre, #k3-plan pre code { white-space: pre-wrap !important; overflow-wrap: anywhere; }
/* table cells break between words, never inside one ("versio|n") */
#k3-plugins-tab td, #k3-plugins-tab th, #k3-presets td, #k3-presets th, #k3-setup-steps td, #k3-setup-steps th {
  word-break: normal !important; overflow-wrap: normal !important; }
""" + PLAN_CSS


def theme():
    return gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")  # fonts ship with Gradio: nothing fetched


@dataclass
class App:
    demo: gr.Blocks
    host: EngineHost
    chats: Chats
    monitor: Monitor


SEED_MAX = 2**64 - 1


def parse_seed(seed) -> int | None:
    """The Seed field: empty (a fresh seed each reply) or a whole number in 0..2**64-1, else refused by name."""
    text = str(seed if seed is not None else "").strip()
    if not text:
        return None
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= len(str(SEED_MAX)) else None
    if value is None or value > SEED_MAX:
        raise refuse(f"Seed: give a whole number from 0 to {SEED_MAX}, or leave it empty for a fresh seed each "
                     f"reply; got {shown(seed)}")
    return value


def sampling(temperature, top_p, top_k, max_tokens, seed) -> SamplingParams:
    seed = parse_seed(seed)
    try:
        return SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                              max_tokens=int(max_tokens), seed=seed)
    except (K3Error, ValueError, TypeError) as exc:
        raise refuse(str(exc)) from None


def header(host: EngineHost) -> str:
    root = host.model
    size = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    c = host.engine.config
    note = model_note(root)
    return (f"# k3 · Kimi K3 on this machine\n**{root.name}** · {human(size)} of weights on disk · {c.num_hidden_layers} layers · "
            f"{c.num_experts} experts per MoE layer · streamed through {human(host.engine.plan.total)} of RAM"
            + (f"\n\n*This is {note}.*" if note else ""))


def build(host: EngineHost, keep_states: int = 2, guard: Guard | None = None) -> App:
    """The page over `host`; `guard` says what clients may change (default: nothing, writes under the cwd)."""
    guard = guard or Guard(admin=False, models_root=Path.cwd())
    monitor = Monitor(host)
    chats = Chats(host, monitor, keep_states=keep_states)
    with gr.Blocks(title="k3 · Kimi K3", analytics_enabled=False) as demo:
        title = gr.Markdown(header(host), elem_id="k3-title")
        with gr.Tabs():
            with gr.Tab("Chat", id="chat"):
                chat_tab(demo, chats, monitor)
            with gr.Tab("Setup", id="setup") as setup:
                setup_tab(host, chats, title, header, setup, guard)
            with gr.Tab("Memory", id="memory") as memory:
                controls, current = memory_tab(host, chats, guard)
            with gr.Tab("Plugins", id="plugins") as plugins:
                listing = plugins_tab(host)

        def redraw_title():  # built once; the model may have changed since (Setup's "use the saved profile")
            return header(host)

        demo.load(redraw_title, None, title, api_visibility="private", concurrency_limit=None)
        # the engine may have been reopened since the page loaded: show what is in force now
        memory.select(current, None, controls, api_visibility="private", concurrency_limit=None)
        plugins.select(lambda: plugins_markdown(host), None, listing, api_visibility="private",
                       concurrency_limit=None)
    return App(check_inputs(demo), host, chats, monitor)


def chat_tab(demo: gr.Blocks, chats: Chats, monitor: Monitor) -> None:
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(label="Kimi K3", height=540, elem_id="k3-chat", autoscroll=True,
                                 buttons=["copy", "copy_all"], feedback_options=None,
                                 placeholder="Ask anything. Replies stream token by token; Stop halts the "
                                             "engine at the next token.")
            note = gr.Markdown(elem_id="k3-note")
            # the box spans the column; its buttons go in rows below it, none wider than it at any width
            box = gr.Textbox(label="Message", show_label=False, placeholder="Message Kimi K3 (Enter to send)",
                             autofocus=True, elem_id="k3-input")
            with gr.Row(elem_id="k3-send-row"):
                send = gr.Button("Send", variant="primary", scale=2, min_width=80, elem_id="k3-send")
                stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="k3-stop")
            with gr.Row(elem_id="k3-edit-row"):
                retry = gr.Button("↻ Retry", size="sm", min_width=80, elem_id="k3-retry")
                undo = gr.Button("↶ Undo", size="sm", min_width=80, elem_id="k3-undo")
                clear = gr.Button("✕ Clear", size="sm", min_width=80, elem_id="k3-clear")
        with gr.Column(scale=2):
            gr.Markdown("### Engine")
            panel = gr.HTML(monitor.render(), elem_id="k3-panel")
            with gr.Accordion("Mode and sampling", open=True):
                mode = gr.Radio(["instruct", "thinking"], value="instruct", label="Mode",
                                info="thinking: the model reasons first; shown collapsed above the answer")
                system = gr.Textbox(label="System prompt", lines=2, placeholder="(none)",
                                    info="changing it recomputes the conversation on the next turn")
                temperature = gr.Slider(0, 2, value=0.0, step=0.05, label="Temperature", elem_id="k3-temperature",
                                        info="0 = greedy, the default here as in `k3 run` / `k3 chat`; K3's "
                                             "suggestion for sampling: 0.6 instruct, 1.0 thinking")
                top_p = gr.Slider(0.05, 1, value=1.0, step=0.01, label="Top-p")
                top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k", info="0 = off")
                max_tokens = gr.Slider(1, 4096, value=512, step=1, label="Max tokens")
                seed = gr.Textbox(label="Seed", placeholder="random", elem_id="k3-seed",
                                  info="empty = a fresh seed each reply (shown below the chat); sampling only")
    knobs = [mode, system, temperature, top_p, top_k, max_tokens, seed]

    def run(key, text, mode, system_prompt, p: SamplingParams):
        for u in chats.reply(key, text, p, mode, system_prompt or None):
            failed = u.status == "error"
            yield u.messages, text if failed else "", ("⚠ " if failed else "") + u.note, monitor.render()

    # the parameter names are what a gradio_client user sees (`client.view_api()`)
    def send_fn(message, mode, system_prompt, temperature, top_p, top_k, max_tokens, seed, request: gr.Request):
        p = sampling(temperature, top_p, top_k, max_tokens, seed)
        if not (message or "").strip():
            yield chats.messages(session_key(request)), "", "", monitor.render()
            return
        yield from run(session_key(request), message, mode, system_prompt, p)

    def retry_fn(mode, system_prompt, temperature, top_p, top_k, max_tokens, seed, request: gr.Request):
        p = sampling(temperature, top_p, top_k, max_tokens, seed)  # refused before the last turn is taken back
        text = chats.undo(session_key(request))
        if not text:
            yield chats.messages(session_key(request)), "", "nothing to retry", monitor.render()
            return
        yield from run(session_key(request), text, mode, system_prompt, p)

    def stop_fn(request: gr.Request):
        chats.stop(session_key(request))
        info = chats.info(session_key(request))
        said = turn_note("", info["last"], info["sampled"]) if info["last"] else "stopped"
        return chats.messages(session_key(request)), said, monitor.render()

    def undo_fn(request: gr.Request):
        text = chats.undo(session_key(request))
        info = chats.info(session_key(request))
        return (chats.messages(session_key(request)), text,
                f"undone; the next turn recomputes {info['history_tokens']} tokens of history" if text else "")

    def clear_fn(request: gr.Request):
        chats.clear(session_key(request))
        return [], "", "new conversation"

    go = dict(outputs=[chatbot, box, note, panel], show_progress="minimal", show_progress_on=[chatbot], **ENGINE)
    sent = send.click(send_fn, [box, *knobs], api_name="send", **go)
    submitted = box.submit(send_fn, [box, *knobs], api_visibility="private", **go)
    retried = retry.click(retry_fn, knobs, api_name="retry", **go)
    running = [sent, submitted, retried]
    stop.click(stop_fn, None, [chatbot, note, panel], cancels=running, api_name="stop", **FREE)
    undo.click(undo_fn, None, [chatbot, box, note], cancels=running, api_name="undo", **FREE)
    clear.click(clear_fn, None, [chatbot, box, note], cancels=running, api_name="clear", **FREE)

    timer = gr.Timer(1.0)
    timer.tick(monitor.render, None, panel, queue=False, api_visibility="private")

    def forget(request: gr.Request):  # the tab closed: its conversation and decode state go
        chats.forget(session_key(request))

    def session_info(request: gr.Request) -> dict:
        """This session's conversation size, whether its decode state is live, and its last turn's stats."""
        return chats.info(session_key(request))

    demo.unload(forget)
    gr.api(session_info, api_name="session", **FREE)
