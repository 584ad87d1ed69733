"""The Memory and Plugins tabs of `k3 ui` (the Setup tab is ui/setup_tab.py). Memory previews the
memory plan of a preset or custom budgets and applies it by reopening the engine (an engine-bound
event: it waits for the running reply); Plugins lists what is installed and what is active.
"""
from __future__ import annotations

import gradio as gr

from k3core import PRESETS, K3Error, describe_plugins

from .guard import ADMIN_FLAG
from .host import PRESET_CHOICES
from .plan_picture import plan_picture


def _plan_text(plan) -> str:
    return f"```\n{plan.text()}\n```"


def _presets_table() -> str:
    rows = "\n".join(f"| {name} | {trunk:g} | {cache:g} |" for name, (trunk, cache) in PRESETS.items())
    return ("| preset | trunk GB (pinned layers + ring) | expert cache GB |\n|---|---|---|\n" + rows +
            "\n\n*auto* picks the largest preset that fits MemAvailable. The trunk budget applies to a packed "
            "trunk (`k3 pack`); without one the whole trunk is resident.")


def _trunk_info(b: dict) -> str:
    return (f"packed trunk {b['trunk']}: pinned layers + streaming ring; editing it makes the preset custom"
            if b["trunk"] else "no packed trunk: the whole trunk is resident, whatever the preset")


def _budgets_line(chosen: str, b: dict) -> str:
    """What a preview is of: the preset chosen (auto: the one it picks) and the budgets it gives."""
    name = chosen if chosen == b["preset"] or not b["preset"] else f"{chosen} → {b['preset']}"
    trunk = f"trunk {b['trunk_gb']:g} GB" if b["trunk_gb"] is not None else "the whole trunk resident"
    return f"{name}: {trunk}, expert cache {b['cache_gb']:g} GB"


def memory_tab(host, chats, guard):
    """Builds the tab; returns (its controls, a function giving their current values) for Tab.select.
    Choosing a preset fills the GB fields with its budgets and previews them; editing a field makes the
    preset custom and previews that."""
    b = host.budget
    gr.Markdown("Budgets decide what stays in RAM: the pinned trunk layers, the streaming ring and the expert "
                "cache. Every budget gives the same tokens; only speed changes.")
    with gr.Row(elem_id="k3-memory-row"):
        with gr.Column(scale=1, min_width=300):
            preset = gr.Dropdown(PRESET_CHOICES, value=b["preset"], label="Preset", elem_id="k3-preset",
                                 info="fills the fields below with its budgets")
            trunk_gb = gr.Number(b["trunk_gb"], label="Trunk GB", interactive=bool(b["trunk"]), minimum=0,
                                 elem_id="k3-trunk-gb", info=_trunk_info(b))
            cache_gb = gr.Number(b["cache_gb"], label="Expert cache GB", elem_id="k3-cache-gb", minimum=0,
                                 info="editing it makes the preset custom")
            save = gr.Checkbox(False, label="Also save as my profile (k3 run / chat / ui use it by default)",
                               interactive=guard.admin)
            preview = gr.Button("Preview plan", elem_id="k3-plan-preview")
            apply = gr.Button("Apply (reloads the engine)", variant="primary", elem_id="k3-plan-apply",
                              interactive=guard.admin)
            if not guard.admin:
                gr.Markdown(f"Apply is off on this page: new budgets reopen the engine for every session. Start "
                            f"`k3 ui {ADMIN_FLAG}` (or with `--auth USER:PASSWORD`) to allow it.",
                            elem_id="k3-memory-off", elem_classes="k3-off")
            status = gr.Markdown(elem_id="k3-memory-status")
        with gr.Column(scale=2, min_width=480):  # below the controls in a narrow window: the plan's lines are long
            picture = gr.HTML(plan_picture(host.engine.plan), elem_id="k3-plan-picture")
            plan = gr.Markdown(_plan_text(host.engine.plan), elem_id="k3-plan")
            gr.Markdown(_presets_table(), elem_id="k3-presets")

    def preview_fn(preset_, trunk_, cache_):
        try:
            p = host.preview(preset_, trunk_, cache_)
            what = _budgets_line(preset_, host.budget_of(preset_, trunk_, cache_))
        except K3Error as exc:
            return "", "", f"⚠ {exc}"
        verdict = "fits" if p.fits else "does NOT fit: applying would be refused"
        return (plan_picture(p), _plan_text(p),
                f"preview: {verdict} · {what} (the running engine's memory counts as used)")

    def choose_fn(preset_, trunk_, cache_):  # a preset chosen: its budgets fill the fields, the plan is theirs
        if preset_ != "custom":
            try:
                b = host.budget_of(preset_)
            except K3Error as exc:
                return gr.skip(), gr.skip(), "", "", f"⚠ {exc}"
            trunk_, cache_ = b["trunk_gb"], b["cache_gb"]
        return trunk_, cache_, *preview_fn(preset_, trunk_, cache_)

    def edit_fn(trunk_, cache_):  # a field edited: the budgets are custom now
        return "custom", *preview_fn("custom", trunk_, cache_)

    def apply_fn(preset_, trunk_, cache_, save_):
        try:
            guard.check_admin("Changing the memory budgets (the engine reopens for every session)")
            p = host.reload(preset_, trunk_, cache_, save=save_)
        except K3Error as exc:
            return plan_picture(host.engine.plan), _plan_text(host.engine.plan), f"⚠ not applied: {exc}"
        chats.free_states()
        return plan_picture(p), _plan_text(p), ("applied: the engine was reopened; each conversation recomputes its "
                                                "history on its next turn"
                                                + (" · saved as your profile" if save_ else ""))

    def current():  # the engine may have been reopened (Apply, or Setup's "use the saved profile")
        b = host.budget
        return (gr.update(value=b["preset"]), gr.update(value=b["trunk_gb"], interactive=bool(b["trunk"]),
                                                       info=_trunk_info(b)),
                b["cache_gb"], plan_picture(host.engine.plan), _plan_text(host.engine.plan))

    inputs = [preset, trunk_gb, cache_gb]
    preview.click(preview_fn, inputs, [picture, plan, status], api_name="plan_preview", concurrency_limit=None)
    # .input, not .change: only a person's choice or edit, never the values these handlers (or `current`) set
    preset.input(choose_fn, inputs, [trunk_gb, cache_gb, picture, plan, status], api_name="plan_choose",
                 concurrency_limit=None)
    for field in (trunk_gb, cache_gb):
        field.input(edit_fn, [trunk_gb, cache_gb], [preset, picture, plan, status], api_visibility="private",
                    concurrency_limit=None)
    apply.click(apply_fn, [*inputs, save], [picture, plan, status], api_name="plan_apply", concurrency_limit=1,
                concurrency_id="engine")
    return [preset, trunk_gb, cache_gb, picture, plan], current


def plugins_markdown(host) -> str:
    engine = host.engine
    c = engine.config
    active = [("kernels", engine.kernels.name), ("trunk placer", engine.placer.name),
              ("expert store", engine.store.name)]
    active += [(f"{kind} attention", engine.attention_for(next(L for L in range(c.num_hidden_layers)
                                                                if c.attention_kind(L) == kind)).name)
               for kind in c.attention_kinds]
    out = ["### Active implementations", "| kind | in use |", "|---|---|"]
    out += [f"| {kind} | `{name}` |" for kind, name in active]
    out += ["", "### Installed plugins", "| plugin | version | from | hooks → what each provides |", "|---|---|---|---|"]
    for row in describe_plugins():
        hooks = "<br>".join(f"`{h}`: {', '.join(row['provides'][h]) or '–'}" for h in row["hooks"])
        out.append(f"| {row['name']} | {row['version']} | {row['source']} | {hooks} |")
    out += ["", "A third-party package adds a plugin through the `k3` entry-point group; `K3_PLUGINS=a,b` loads "
                "only those (`k3 plugins` lists the same in a terminal)."]
    return "\n".join(out)


def plugins_tab(host):
    """Builds the tab; returns its Markdown (redrawn with plugins_markdown when the tab is selected)."""
    return gr.Markdown(plugins_markdown(host), elem_id="k3-plugins-tab")
