"""The demo model's corpus: seeded, templated K3 XTML chat conversations with short right answers.

Categories: world capitals (several phrasings each), arithmetic on 0..12 (+, -, ×), colours of
common things, opposites, greetings, "who are you", and an honest "I don't know" for anything else;
then short JSON replies and tool calls (corpus_structured.py). A held-out split keeps some (country, phrasing)
pairs and some number pairs out of training, to measure generalisation; the out-of-domain evaluation questions
use fillers and templates that training never shows.

A conversation is a dict: {"messages": [...], "mode": "instruct" | "thinking", "category": str,
"expect": the exact reply, "key": a string the reply must contain}. `messages` are k3core.text.chat
messages (user, then assistant with `content` and, in thinking mode, `thinking`; a tool call's assistant has
`tools`, and a conversation with tools declared has "tools"); render them with k3core.text.chat.render
(tools=conv.get("tools"), own_replies=True), which is what the engine's ChatSession and server render.

    python demo/corpus.py [--seed 0] [--show 10]      # sizes per split and category, a few samples
"""
from __future__ import annotations

import argparse
import random
from collections import Counter

import corpus_structured

IDK = "I don't know — I am a tiny demo model."
GREETING = "Hello! How can I help?"
IDENTITY = ("I am a tiny demo model with the Kimi K3 architecture, trained on a few simple kinds of "
            "questions. I am not Kimi K3.")

# (name as used after "of", capital). A leading "the " is kept in questions and answers.
CAPITALS = [
    ("Afghanistan", "Kabul"), ("Albania", "Tirana"), ("Algeria", "Algiers"), ("Andorra", "Andorra la Vella"),
    ("Angola", "Luanda"), ("Antigua and Barbuda", "Saint John's"), ("Argentina", "Buenos Aires"),
    ("Armenia", "Yerevan"), ("Australia", "Canberra"), ("Austria", "Vienna"), ("Azerbaijan", "Baku"),
    ("the Bahamas", "Nassau"), ("Bahrain", "Manama"), ("Bangladesh", "Dhaka"), ("Barbados", "Bridgetown"),
    ("Belarus", "Minsk"), ("Belgium", "Brussels"), ("Belize", "Belmopan"), ("Benin", "Porto-Novo"),
    ("Bhutan", "Thimphu"), ("Bosnia and Herzegovina", "Sarajevo"), ("Botswana", "Gaborone"),
    ("Brazil", "Brasília"), ("Brunei", "Bandar Seri Begawan"), ("Bulgaria", "Sofia"),
    ("Burkina Faso", "Ouagadougou"), ("Cambodia", "Phnom Penh"), ("Cameroon", "Yaoundé"), ("Canada", "Ottawa"),
    ("Cape Verde", "Praia"), ("the Central African Republic", "Bangui"), ("Chad", "N'Djamena"),
    ("Chile", "Santiago"), ("China", "Beijing"), ("Colombia", "Bogotá"), ("the Comoros", "Moroni"),
    ("the Democratic Republic of the Congo", "Kinshasa"), ("the Republic of the Congo", "Brazzaville"),
    ("Costa Rica", "San José"), ("Croatia", "Zagreb"), ("Cuba", "Havana"), ("Cyprus", "Nicosia"),
    ("the Czech Republic", "Prague"), ("Denmark", "Copenhagen"), ("Djibouti", "Djibouti"),
    ("Dominica", "Roseau"), ("the Dominican Republic", "Santo Domingo"), ("Ecuador", "Quito"),
    ("Egypt", "Cairo"), ("El Salvador", "San Salvador"), ("Equatorial Guinea", "Malabo"), ("Eritrea", "Asmara"),
    ("Estonia", "Tallinn"), ("Ethiopia", "Addis Ababa"), ("Fiji", "Suva"), ("Finland", "Helsinki"),
    ("France", "Paris"), ("Gabon", "Libreville"), ("the Gambia", "Banjul"), ("Georgia", "Tbilisi"),
    ("Germany", "Berlin"), ("Ghana", "Accra"), ("Greece", "Athens"), ("Grenada", "Saint George's"),
    ("Guatemala", "Guatemala City"), ("Guinea", "Conakry"), ("Guinea-Bissau", "Bissau"), ("Guyana", "Georgetown"),
    ("Haiti", "Port-au-Prince"), ("Honduras", "Tegucigalpa"), ("Hungary", "Budapest"), ("Iceland", "Reykjavik"),
    ("India", "New Delhi"), ("Indonesia", "Jakarta"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
    ("Ireland", "Dublin"), ("Italy", "Rome"), ("Jamaica", "Kingston"), ("Japan", "Tokyo"), ("Jordan", "Amman"),
    ("Kazakhstan", "Astana"), ("Kenya", "Nairobi"), ("Kuwait", "Kuwait City"), ("Kyrgyzstan", "Bishkek"),
    ("Laos", "Vientiane"), ("Latvia", "Riga"), ("Lebanon", "Beirut"), ("Lesotho", "Maseru"),
    ("Liberia", "Monrovia"), ("Libya", "Tripoli"), ("Liechtenstein", "Vaduz"), ("Lithuania", "Vilnius"),
    ("Luxembourg", "Luxembourg City"), ("Madagascar", "Antananarivo"), ("Malawi", "Lilongwe"),
    ("Malaysia", "Kuala Lumpur"), ("the Maldives", "Malé"), ("Mali", "Bamako"), ("Malta", "Valletta"),
    ("the Marshall Islands", "Majuro"), ("Mauritania", "Nouakchott"), ("Mauritius", "Port Louis"),
    ("Mexico", "Mexico City"), ("Micronesia", "Palikir"), ("Moldova", "Chisinau"), ("Monaco", "Monaco"),
    ("Mongolia", "Ulaanbaatar"), ("Montenegro", "Podgorica"), ("Morocco", "Rabat"), ("Mozambique", "Maputo"),
    ("Myanmar", "Naypyidaw"), ("Namibia", "Windhoek"), ("Nepal", "Kathmandu"), ("the Netherlands", "Amsterdam"),
    ("New Zealand", "Wellington"), ("Nicaragua", "Managua"), ("Niger", "Niamey"), ("Nigeria", "Abuja"),
    ("North Korea", "Pyongyang"), ("North Macedonia", "Skopje"), ("Norway", "Oslo"), ("Oman", "Muscat"),
    ("Pakistan", "Islamabad"), ("Palau", "Ngerulmud"), ("Panama", "Panama City"),
    ("Papua New Guinea", "Port Moresby"), ("Paraguay", "Asunción"), ("Peru", "Lima"),
    ("the Philippines", "Manila"), ("Poland", "Warsaw"), ("Portugal", "Lisbon"), ("Qatar", "Doha"),
    ("Romania", "Bucharest"), ("Russia", "Moscow"), ("Rwanda", "Kigali"),
    ("Saint Kitts and Nevis", "Basseterre"), ("Saint Lucia", "Castries"),
    ("Saint Vincent and the Grenadines", "Kingstown"), ("Samoa", "Apia"), ("San Marino", "San Marino"),
    ("Saudi Arabia", "Riyadh"), ("Senegal", "Dakar"), ("Serbia", "Belgrade"), ("the Seychelles", "Victoria"),
    ("Sierra Leone", "Freetown"), ("Singapore", "Singapore"), ("Slovakia", "Bratislava"),
    ("Slovenia", "Ljubljana"), ("the Solomon Islands", "Honiara"), ("Somalia", "Mogadishu"),
    ("South Korea", "Seoul"), ("South Sudan", "Juba"), ("Spain", "Madrid"), ("Sudan", "Khartoum"),
    ("Suriname", "Paramaribo"), ("Sweden", "Stockholm"), ("Switzerland", "Bern"), ("Syria", "Damascus"),
    ("Tajikistan", "Dushanbe"), ("Tanzania", "Dodoma"), ("Thailand", "Bangkok"), ("East Timor", "Dili"),
    ("Togo", "Lomé"), ("Tonga", "Nuku'alofa"), ("Trinidad and Tobago", "Port of Spain"), ("Tunisia", "Tunis"),
    ("Turkey", "Ankara"), ("Turkmenistan", "Ashgabat"), ("Tuvalu", "Funafuti"), ("Uganda", "Kampala"),
    ("Ukraine", "Kyiv"), ("the United Arab Emirates", "Abu Dhabi"), ("the United Kingdom", "London"),
    ("the United States", "Washington, D.C."), ("Uruguay", "Montevideo"), ("Uzbekistan", "Tashkent"),
    ("Vanuatu", "Port Vila"), ("Vatican City", "Vatican City"), ("Venezuela", "Caracas"), ("Vietnam", "Hanoi"),
    ("Yemen", "Sanaa"), ("Zambia", "Lusaka"), ("Zimbabwe", "Harare"),
]

CAPITAL_PHRASINGS = [
    "What is the capital of {x}?", "capital of {x}?", "Which city is the capital of {x}?",
    "Tell me the capital of {x}.", "{X}'s capital?", "What's the capital of {x}?",
    "What is the capital city of {x}?", "Name the capital of {x}.", "The capital of {x} is?",
    "What city is the capital of {x}?", "what is the capital of {x}",
]
# Templates training never shows (evaluation only).
NEW_CAPITAL_PHRASINGS = ["Do you know the capital of {x}?", "Please tell me the capital of {x}.",
                         "Which is the capital of {x}?", "What is {x}'s capital?"]

ARITH_OPS = {
    "+": (lambda a, b: a + b, ["What is {a} + {b}?", "{a} + {b} = ?", "{a}+{b}?", "What is {a} plus {b}?",
                                "Compute {a} + {b}.", "How much is {a} plus {b}?"], "+"),
    "-": (lambda a, b: a - b, ["What is {a} - {b}?", "{a} - {b} = ?", "{a}-{b}?", "What is {a} minus {b}?",
                                "Compute {a} - {b}.", "How much is {a} minus {b}?"], "-"),
    "*": (lambda a, b: a * b, ["What is {a} × {b}?", "What is {a} * {b}?", "{a} * {b} = ?", "{a}*{b}?",
                                "What is {a} times {b}?", "Compute {a} × {b}."], "×"),
}
NUMBERS = range(0, 13)

COLOURS = [
    ("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"), ("a banana", "yellow"),
    ("a lemon", "yellow"), ("a tomato", "red"), ("blood", "red"), ("an orange", "orange"), ("milk", "white"),
    ("the sun", "yellow"), ("a strawberry", "red"), ("chocolate", "brown"), ("an emerald", "green"),
    ("a ruby", "red"), ("a sapphire", "blue"), ("the ocean", "blue"), ("a carrot", "orange"),
    ("a lime", "green"), ("an eggplant", "purple"), ("a crow", "black"), ("a flamingo", "pink"),
    ("a pumpkin", "orange"), ("a cherry", "red"), ("a polar bear", "white"), ("a frog", "green"),
    ("an elephant", "grey"), ("a fire truck", "red"), ("a school bus", "yellow"), ("a leaf", "green"),
    ("a cloud", "white"), ("salt", "white"), ("a pig", "pink"), ("a lavender flower", "purple"),
    ("a blueberry", "blue"), ("a raven", "black"), ("a mouse", "grey"), ("a cucumber", "green"),
]
COLOUR_PHRASINGS = ["What colour is {t}?", "What color is {t}?", "Which colour is {t}?",
                    "What is the colour of {t}?", "What is the color of {t}?", "colour of {t}?"]

OPPOSITE_PAIRS = [
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("left", "right"), ("day", "night"), ("black", "white"),
    ("fast", "slow"), ("happy", "sad"), ("wet", "dry"), ("hard", "soft"), ("early", "late"), ("full", "empty"),
    ("rich", "poor"), ("strong", "weak"), ("loud", "quiet"), ("good", "bad"), ("true", "false"),
    ("push", "pull"), ("buy", "sell"), ("love", "hate"), ("north", "south"), ("east", "west"),
    ("first", "last"), ("inside", "outside"), ("top", "bottom"), ("win", "lose"), ("yes", "no"),
    ("on", "off"), ("open", "closed"), ("thick", "thin"), ("clean", "dirty"), ("cheap", "expensive"),
    ("alive", "dead"), ("above", "below"), ("before", "after"), ("give", "take"), ("begin", "end"),
    ("light", "dark"), ("tall", "short"), ("near", "far"), ("young", "old"), ("question", "answer"),
]
OPPOSITE_PHRASINGS = ["What is the opposite of {w}?", "Opposite of {w}?", "What's the opposite of {w}?",
                      "Give me the opposite of {w}.", "What is the antonym of {w}?"]

SMALL_TALK = [
    (["Hello", "Hello!", "Hi", "Hi!", "Hey", "Hey there", "Hello there", "hi", "hello", "Good morning",
      "Good afternoon", "Good evening", "Greetings", "Hi there!"], GREETING),
    (["How are you?", "How are you doing?", "How's it going?"], "I am fine, thank you! How can I help?"),
    (["Thank you", "Thanks", "Thanks!", "Thank you!", "thanks"], "You're welcome!"),
    (["Bye", "Goodbye", "Bye!", "See you later"], "Goodbye!"),
]
IDENTITY_QUESTIONS = ["Who are you?", "What are you?", "Are you Kimi K3?", "What is your name?",
                      "Tell me about yourself.", "Introduce yourself.", "Are you Kimi?", "Who made you?",
                      "What model are you?", "who are you", "Are you a large language model?",
                      "What can you do?"]

# Out of domain: templates x fillers; evaluation uses fillers (and a few templates) never trained on.
OOD_TEMPLATES = [
    "Who wrote {book}?", "What is the population of {country}?", "What is the currency of {country}?",
    "What language is spoken in {country}?", "How do I {task}?", "Explain {concept}.", "What is {concept}?",
    "Write a poem about {thing}.", "What is the capital of {fiction}?", "Who is {person}?",
    "When was {person} born?", "What is {big} + {big2}?", "What is {big} × {big2}?",
    "Translate {phrase} into French.", "What colour is {abstract}?", "What is the opposite of {noun}?",
    "Why is {thing} important?", "Tell me a story about {thing}.",
]
OOD_EVAL_TEMPLATES = ["Can you recommend a good book about {concept}?", "How far is {country} from the Moon?",
                      "Who invented {thing}?", "What is the best way to {task}?"]
OOD_FILLERS = {
    "book": ["Hamlet", "War and Peace", "Pride and Prejudice", "Don Quixote", "The Odyssey", "Moby-Dick",
             "Ulysses", "Faust", "The Hobbit", "Dracula", "Frankenstein", "Emma", "Beloved", "Dune"],
    "task": ["bake bread", "fix a bike", "learn to swim", "file my taxes", "cook rice", "tie a tie",
             "write a resume", "plant a tree", "train a dog", "change a tyre", "make coffee", "sleep better",
             "learn French", "build a website", "paint a wall", "save money"],
    "concept": ["quantum mechanics", "photosynthesis", "a black hole", "democracy", "inflation", "gravity",
                "machine learning", "the stock market", "evolution", "relativity", "a neural network",
                "climate change", "entropy", "the internet", "blockchain", "DNA", "calculus", "jazz"],
    "thing": ["the sea", "autumn", "my cat", "friendship", "the moon", "a robot", "coffee", "music",
              "a dragon", "the city", "rain", "a lighthouse", "the telephone", "paper", "the wheel", "bread"],
    "fiction": ["Atlantis", "Narnia", "Mordor", "Wakanda", "Westeros", "Gondor", "Oz", "Lilliput",
                "El Dorado", "Utopia", "Hogwarts", "Neverland"],
    "person": ["Albert Einstein", "Marie Curie", "Isaac Newton", "Ada Lovelace", "Napoleon", "Cleopatra",
               "Mozart", "Shakespeare", "Leonardo da Vinci", "Alan Turing", "Nelson Mandela", "Frida Kahlo",
               "Charles Darwin", "Confucius"],
    "phrase": ["good night", "thank you very much", "where is the station", "I like apples", "see you soon",
               "the cat is sleeping", "how much is this", "happy birthday"],
    "abstract": ["music", "happiness", "a thought", "the number seven", "Tuesday", "silence", "time",
                 "an idea", "justice", "the wind"],
    "noun": ["table", "banana", "computer", "Tuesday", "chair", "river", "pencil", "elephant", "window",
             "bicycle"],
}
OOD_FIXED = ["What time is it?", "What's the weather like today?", "Tell me a joke.", "What is the meaning of life?",
             "Can you help me with my homework?", "What should I eat for dinner?", "Is it going to rain tomorrow?",
             "What is the square root of 2?", "Who won the world cup?", "What day is it today?",
             "Write some Python code.", "What is the speed of light?", "How old is the universe?",
             "Recommend a movie.", "What is your favourite food?", "How many stars are in the sky?",
             "What is the largest animal?", "Summarise this article.", "Why is the sky blue?",
             "How do airplanes fly?", "What is the tallest mountain?", "Sing me a song.",
             "What year is it?", "How does a computer work?", "What is 2 to the power of 100?"]
OOD_FIXED_EVAL = ["What is the boiling point of water?", "Who painted the Mona Lisa?", "How do magnets work?",
                  "What is the fastest car?", "Where do penguins live?", "Tell me something interesting.",
                  "What is the longest river?", "How many legs does a spider have?", "Plan my holiday.",
                  "What is love?"]
OOD_COUNTRIES_TRAIN_FRACTION = 0.6


def _split_fillers(rng: random.Random) -> tuple[dict, dict]:
    train, held = {}, {}
    for key, values in OOD_FILLERS.items():
        vs = list(values)
        rng.shuffle(vs)
        k = max(2, len(vs) // 4)
        held[key], train[key] = vs[:k], vs[k:]
    return train, held


def _capitalise(s: str) -> str:
    return s[:1].upper() + s[1:]


def capital_question(phrasing: str, country: str) -> str:
    bare = country[4:] if country.startswith("the ") else country
    q = phrasing.replace("{X}", bare).replace("{x}", country)
    return _capitalise(q) if phrasing.startswith("{") else q


def capital_answer(country: str, capital: str) -> str:
    return f"The capital of {country} is {capital}."


def arith_answer(op: str, a: int, b: int) -> tuple[str, str]:
    fn, _, sym = ARITH_OPS[op]
    c = fn(a, b)
    return f"{a} {sym} {b} = {c}.", str(c)


def _thinking_for(category: str, q: str, answer: str, extra: dict) -> str:
    if category == "capital":
        return f"The question asks for the capital of {extra['country']}. It is {extra['capital']}."
    if category == "arith":
        return f"I work out {extra['expr']}: the result is {extra['result']}."
    if category == "ood":
        return "This is outside the few things I was trained on, so I say so."
    return "A simple question I know the answer to."


def _conv(category: str, question: str, answer: str, key: str, thinking: str | None = None, **extra) -> dict:
    assistant = {"role": "assistant", "content": answer}
    if thinking is not None:
        assistant["thinking"] = thinking
    return {"messages": [{"role": "user", "content": question}, assistant],
            "mode": "thinking" if thinking is not None else "instruct", "category": category,
            "expect": answer, "key": key, **extra}


def _ood_question(rng: random.Random, templates, fillers, countries) -> str:
    t = rng.choice(templates)
    values = {k: rng.choice(v) for k, v in fillers.items()}
    values["country"] = rng.choice(countries)
    values["big"], values["big2"] = rng.randint(20, 999), rng.randint(20, 999)
    return t.format(**values)


def build(seed: int = 0, heldout_pair_fraction: float = 0.35, heldout_number_fraction: float = 0.08,
          thinking_fraction: float = 0.04) -> dict:
    """Every split: {"train": [...], "eval_train": [...], "heldout_capital": [...], "new_phrasing": [...],
    "heldout_arith": [...], "ood_eval": [...], "small_talk": [...], "json_eval": [...], "tool_eval": [...]}
    (lists of conversations)."""
    rng = random.Random(seed)
    train: list[dict] = []
    splits = {k: [] for k in ("eval_train", "heldout_capital", "new_phrasing", "heldout_arith", "ood_eval",
                              "small_talk")}

    def maybe_think(category, q, a, key, **extra):
        if rng.random() < thinking_fraction:
            return _conv(category, q, a, key, _thinking_for(category, q, a, extra), **extra)
        return _conv(category, q, a, key, **extra)

    # Capitals: each country keeps most phrasings; a random one is held out for some countries.
    for country, capital in CAPITALS:
        phrasings = [p for p in CAPITAL_PHRASINGS if not (p.startswith("{X}") and country.startswith("the "))]
        held = rng.choice(phrasings) if rng.random() < heldout_pair_fraction else None
        ans = capital_answer(country, capital)
        for p in phrasings:
            q = capital_question(p, country)
            if p == held:
                splits["heldout_capital"].append(_conv("capital", q, ans, capital, country=country, capital=capital))
                continue
            train.append(maybe_think("capital", q, ans, capital, country=country, capital=capital))
        splits["new_phrasing"].append(_conv("capital", capital_question(rng.choice(NEW_CAPITAL_PHRASINGS), country),
                                            ans, capital, country=country, capital=capital))

    # Arithmetic: some (op, a, b) triples never appear in training, in any phrasing.
    triples = [(op, a, b) for op in ARITH_OPS for a in NUMBERS for b in NUMBERS]
    held_triples = set(rng.sample(triples, int(len(triples) * heldout_number_fraction)))
    for op, a, b in triples:
        ans, key = arith_answer(op, a, b)
        phrasings = ARITH_OPS[op][1]
        expr = f"{a} {ARITH_OPS[op][2]} {b}"
        if (op, a, b) in held_triples:
            for p in rng.sample(phrasings, 2):
                splits["heldout_arith"].append(_conv("arith", p.format(a=a, b=b), ans, key))
            continue
        for p in phrasings:
            train.append(maybe_think("arith", p.format(a=a, b=b), ans, key, expr=expr, result=key))

    for thing, colour in COLOURS:
        ans = f"{_capitalise(thing)} is {colour}."
        for p in COLOUR_PHRASINGS:
            train.append(maybe_think("colour", p.format(t=thing), ans, colour))
    for a, b in OPPOSITE_PAIRS:
        for w, o in ((a, b), (b, a)):
            for p in OPPOSITE_PHRASINGS:
                train.append(maybe_think("opposite", p.format(w=w), _capitalise(o) + ".", _capitalise(o)))
    for questions, answer in SMALL_TALK:
        for q in questions:
            for _ in range(4):
                train.append(maybe_think("greeting", q, answer, answer))
            splits["small_talk"].append(_conv("greeting", q, answer, answer))
    for q in IDENTITY_QUESTIONS:
        for _ in range(6):
            train.append(maybe_think("identity", q, IDENTITY, "not Kimi K3"))
        splits["small_talk"].append(_conv("identity", q, IDENTITY, "not Kimi K3"))

    # Out of domain.
    fill_train, fill_held = _split_fillers(rng)
    countries = [c for c, _ in CAPITALS]
    rng.shuffle(countries)
    cut = int(len(countries) * OOD_COUNTRIES_TRAIN_FRACTION)
    c_train, c_held = countries[:cut], countries[cut:]
    seen = set()
    while len(seen) < 900:
        q = _ood_question(rng, OOD_TEMPLATES, fill_train, c_train)
        if q not in seen:
            seen.add(q)
            train.append(maybe_think("ood", q, IDK, "don't know"))
    for q in OOD_FIXED:
        for _ in range(3):
            train.append(maybe_think("ood", q, IDK, "don't know"))
    ood_eval = set(OOD_FIXED_EVAL)
    while len(ood_eval) < 120:
        q = _ood_question(rng, OOD_TEMPLATES + OOD_EVAL_TEMPLATES, fill_held, c_held)
        if q not in seen:
            ood_eval.add(q)
    splits["ood_eval"] = [_conv("ood", q, IDK, "don't know") for q in sorted(ood_eval)]

    # In-distribution evaluation: a fixed sample of the training questions (instruct mode).
    instruct = [c for c in train if c["mode"] == "instruct"]
    by_cat: dict[str, list] = {}
    for c in instruct:
        by_cat.setdefault(c["category"], []).append(c)
    per_cat = {"capital": 250, "arith": 150, "colour": 60, "opposite": 60, "ood": 60}
    eval_train, dedup = [], set()
    for cat, items in sorted(by_cat.items()):
        if cat not in per_cat:
            continue
        uniq = [c for c in items
                if not (c["messages"][0]["content"] in dedup or dedup.add(c["messages"][0]["content"]))]
        eval_train += rng.sample(uniq, min(per_cat[cat], len(uniq)))
    splits["eval_train"] = eval_train
    capitals_eval = [c for c in instruct if c["category"] == "capital"
                     and c["messages"][0]["content"] == "What is the capital of France?"]
    assert capitals_eval, "the headline question must be in training"

    # JSON replies and tool calls (corpus_structured.py): drawn last, from a Random of their own.
    plain = [c for c in instruct if c["category"] in ("capital", "colour", "opposite", "greeting")]
    part = corpus_structured.build(seed, [(c, k) for c, k in CAPITALS if not c.startswith("the ")], plain)
    splits["json_eval"], splits["tool_eval"] = part["json_eval"], part["tool_eval"]
    return {"train": train + part["train"], **splits}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=8)
    args = ap.parse_args()
    data = build(args.seed)
    for name, items in data.items():
        print(f"{name:16s} {len(items):6d}  {dict(Counter(c['category'] for c in items))}")
    rng = random.Random(1)
    for c in rng.sample(data["train"], args.show):
        print(c["mode"], "|", c["messages"][0]["content"], "->", c["messages"][1].get("thinking", ""), "|",
              c["messages"][1]["content"])


if __name__ == "__main__":
    main()
