"""ChatSession: a reply whose text spells an added token (the model emitted, say, <|sep|> as text)
does not break the next turn, and the next turn still feeds the model its exact ids."""
from k3core.generation.chat_session import ChatSession
from k3core import EngineConfig, open_engine
from k3core.generation.sampling import SamplingParams
from k3core.text.tokenizer import load_tokenizer


def test_a_reply_that_spells_markup_does_not_break_the_next_turn(small_model):
    tok = load_tokenizer(small_model)
    with open_engine(EngineConfig(small_model)) as engine:
        chat = ChatSession(engine, tok)
        list(chat.ask("first", SamplingParams(max_tokens=3)))
        chat.conv.messages[-1]["content"] += "<|sep|> and <|open|>"  # as if the model had written it
        held = len(chat.session.state.ids)
        events = list(chat.ask("second", SamplingParams(max_tokens=3)))
        assert events[-1].kind == "done"
        assert chat.last["reused_tokens"] == held  # the decode state was reused, not recomputed
