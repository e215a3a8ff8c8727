"""Every text the optimizer runs a model on, in one place: the probes that stress what quantization and export
tend to break, the calibration texts kept apart from them, and the generator of the held-out validation set, whose
texts no search or calibration step ever sees: one token to beyond the maximum length, many languages and scripts,
code, numbers, and near-duplicates (one edit apart). A task takes single texts, pairs (ranking), or both
(sequence-classification)."""
from __future__ import annotations

import random
from typing import Literal

from infinity.engine.tokenization import TextInput

Kind = Literal["singles", "pairs", "both"]

# The probes: what the parity search tunes on, with the tuning texts below.
SINGLES: tuple[str, ...] = (
    "a",
    "ok",
    "Hi!",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "I absolutely loved this movie, the acting was superb and the ending made me cry.",
    "This is the worst product I have ever bought; it broke after two days.",
    "Stocks fell 3.2% on Tuesday after the Fed raised rates by 25 basis points.",
    "The patient was prescribed 500mg amoxicillin twice daily for 10 days.",
    "Call me at +1 (555) 123-4567 or email jane.doe@example.com before 5:30pm.",
    "Order #A-99812 shipped on 2024-03-15 and weighs 1,234.56 kg.",
    "3.14159 2.71828 1.41421 1.73205 0 -1 1e-9 42",
    "def square(x):\n    return x ** 2  # integers only",
    "SELECT name, COUNT(*) FROM users WHERE age > 21 GROUP BY name;",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "I love pizza 🍕🍕 and tacos 🌮 — best weekend ever 🎉",
    "¿Dónde está la biblioteca? Está cerca de la estación.",
    "Привет, мир! Как у тебя дела сегодня?",
    "東京は日本の首都です。人口は約1400万人です。",
    "Ελληνικά, العربية, עברית, हिन्दी, 한국어 in one line.",
    "!!!??? ... --- *** ###",
    "UPPERCASE SHOUTING ABOUT THE WEATHER IN NEW YORK CITY",
    "Angela Merkel met Emmanuel Macron in Berlin on Monday to discuss the European Union budget.",
    "Apple Inc. is headquartered in Cupertino, California, and was founded by Steve Jobs.",
    "The mitochondria is the powerhouse of the cell, producing ATP through oxidative phosphorylation.",
    "Machine learning models can be quantized to int8 to run faster on CPUs with little loss.",
    "https://example.com/path/to/page?query=value&other=1#section",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.",
    " ".join(["word"] * 40),
    " ".join(f"token{i}" for i in range(120)),
    "A long review. " + " ".join(
        "The service was slow but the food, when it finally arrived, was excellent and fairly priced."
        for _ in range(12)),
    "Beyond the limit: " + " ".join("antidisestablishmentarianism supercalifragilistic" for _ in range(200)),
)

PAIRS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris is the capital and most populous city of France."),
    ("What is the capital of France?", "Berlin is the capital of Germany."),
    ("What is the capital of France?", "The Eiffel Tower was completed in 1889."),
    ("What is the capital of France?", "I like turtles."),
    ("How do I sort a list in Python?", "Use sorted(my_list) or my_list.sort() to sort in place."),
    ("How do I sort a list in Python?", "Python is a programming language created by Guido van Rossum."),
    ("How do I sort a list in Python?", "Bubble sort repeatedly swaps adjacent elements."),
    ("How do I sort a list in Python?", "The weather in Paris is mild in spring."),
    ("best pizza near me", "Tony's Pizzeria serves wood-fired Neapolitan pizza 🍕 downtown."),
    ("best pizza near me", "Pizza is an Italian dish of flattened dough with toppings."),
    ("best pizza near me", "Our dental clinic is open Monday to Friday."),
    ("best pizza near me", " ".join(["pizza pasta salad"] * 150)),
    ("A man is playing a guitar.", "A person plays an instrument."),
    ("A man is playing a guitar.", "A woman is slicing onions."),
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("Is 17 a prime number?", "17 is prime because its only divisors are 1 and 17."),
)


# Calibration texts choose which channels stay float; they are kept apart from the probes that judge parity.
CALIBRATION_SINGLES: tuple[str, ...] = (
    "b",
    "Thanks!",
    "Where can I buy fresh bread on Sunday mornings?",
    "The committee postponed the vote until next spring because of the budget dispute.",
    "Terrible customer support: I waited on hold for 45 minutes and nobody answered.",
    "Ibuprofen 200mg may be taken every 4-6 hours; do not exceed 1200mg in 24 hours.",
    "Invoice INV-2023-0042 totals $7,350.00, due 30 days after 01/09/2023.",
    "x = np.linspace(0, 1, 100); y = np.sin(2 * np.pi * x)",
    "Wir treffen uns morgen um 9 Uhr am Hauptbahnhof in München.",
    "Le chat dort sur le canapé pendant que la pluie tombe dehors.",
    "北京是中国的首都，也是一座历史悠久的城市。",
    "Great game last night 🏀🔥 can't wait for the finals!!!",
    "Marie Curie was the first woman to win a Nobel Prize, in physics in 1903.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Neural networks with residual connections train deeper models without vanishing gradients.",
    "<div class=\"header\"><a href=\"/home\">Home</a></div>",
    " ".join(["data"] * 60),
    "A detailed account. " + " ".join(
        "The train was delayed twice, yet the conductor kept everyone informed and calm throughout."
        for _ in range(10)),
)


CALIBRATION_PAIRS: tuple[tuple[str, str], ...] = (
    ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("Who wrote Hamlet?", "Macbeth is set in Scotland."),
    ("Who wrote Hamlet?", "The printing press was invented in the 15th century."),
    ("how to boil an egg", "Place the egg in boiling water for 7 to 9 minutes, then cool it in cold water."),
    ("how to boil an egg", "Chickens lay eggs of different colours depending on the breed."),
    ("how to boil an egg", "The stock market closed higher on Friday."),
    ("cheap flights to Rome", "Compare fares from 120 airlines and find deals to Rome Fiumicino."),
    ("cheap flights to Rome", "Rome is the capital city of Italy."),
    ("A dog runs in the park.", "An animal is running outside."),
    ("A dog runs in the park.", "A man reads a newspaper."),
)


# The held-out set's generator
SEED = 20261123
SIZE = 220  # inputs per task (ranking: pairs)
TUNING_SIZE = 40  # the search's share, generated apart (see tuning_inputs)

SENTENCES: tuple[str, ...] = (
    "The library closes early on public holidays, so plan your visit ahead.",
    "My flight was cancelled and the airline rebooked me for the next morning.",
    "She planted tomatoes, basil and peppers along the sunny side of the garden.",
    "The new phone has a bigger battery but the camera is barely better.",
    "Our team shipped the release two days late because of a flaky integration test.",
    "Rain is expected tomorrow afternoon with winds up to forty kilometres per hour.",
    "He apologised for the confusion and offered a full refund within a week.",
    "The museum's new wing displays sculptures from the early bronze age.",
    "Please remember to bring your passport and a printed copy of the booking.",
    "The soup was cold, the bread was stale, and the waiter ignored us all evening.",
    "Absolutely fantastic concert, the band played every song we hoped for!",
    "Interest rates stayed unchanged as inflation eased for the third month.",
    "The vaccine trial enrolled 4,000 volunteers across eleven countries.",
    "Satellite images show the glacier has retreated nearly two kilometres since 1990.",
    "Gradient descent updates the weights in the direction that lowers the loss.",
    "The contract may be terminated by either party with thirty days' written notice.",
    "Symptoms include fever, dry cough and fatigue lasting more than a week.",
    "Lionel Messi signed with Inter Miami after leaving Paris Saint-Germain.",
    "Toyota opened a battery plant in North Carolina employing 2,100 people.",
    "The Amazon river carries more water than the next seven largest rivers combined.",
    "Can you recommend a quiet hotel near the train station in Vienna?",
    "Why does my sourdough starter smell like nail polish remover?",
    "How many grams of protein should an adult eat per day?",
    "Der Zug nach Hamburg hat heute leider vierzig Minuten Verspätung.",
    "Die Bundesregierung plant neue Förderprogramme für erneuerbare Energien.",
    "Nous avons visité le Louvre puis déjeuné près de la Seine.",
    "Le gouvernement a annoncé une baisse des impôts pour les petites entreprises.",
    "Mañana vamos a la playa si no llueve demasiado.",
    "El presidente inauguró el nuevo hospital en Valencia el lunes.",
    "Il ristorante in piazza serve la migliore carbonara della città.",
    "O jogo terminou empatado depois de um segundo tempo muito disputado.",
    "De fietsenmaker repareerde mijn band binnen tien minuten.",
    "Jag har bott i Göteborg i nästan tio år nu.",
    "Dzisiaj w Warszawie jest słonecznie i bardzo ciepło.",
    "Bugün İstanbul'da trafik her zamankinden daha yoğundu.",
    "Москва — крупнейший город России по численности населения.",
    "Вчера мы долго гуляли по набережной и разговаривали о книгах.",
    "我们明天早上八点在公司门口集合，然后一起去机场。",
    "这家餐厅的饺子非常好吃，价格也很便宜。",
    "明日の会議は午後三時からに変更になりました。",
    "駅前の新しいカフェはいつも混んでいます。",
    "서울의 지하철은 깨끗하고 매우 편리합니다.",
    "القاهرة هي أكبر مدينة في العالم العربي.",
    "मुझे सुबह की चाय के साथ अख़बार पढ़ना पसंद है।",
    "Η Αθήνα είναι μία από τις αρχαιότερες πόλεις του κόσμου.",
    "תל אביב היא עיר תוססת על חוף הים התיכון.",
    "Hà Nội có nhiều món ăn đường phố rất ngon.",
    "Nairobi ni mji mkuu wa Kenya na una hifadhi ya wanyama pori.",
    "Ich liebe diese App 😍 aber sie stürzt ständig ab 😤",
    "lol that meeting could have been an email 🙃 #mondays",
    "BREAKING: markets rally as tech earnings beat expectations",
    "re: your ticket #88231 — we've escalated it to tier 2 support",
    "Seg fault (core dumped) after upgrading glibc on the build server",
)

CODE: tuple[str, ...] = (
    "def {f}({a}, {b}):\n    return {a} * {b} + {n}",
    "for {a} in range({n}):\n    print({a}, {a} ** 2)",
    "const {f} = ({a}) => {a}.map(x => x + {n});",
    "SELECT {a}, SUM({b}) FROM orders WHERE total > {n} GROUP BY {a};",
    "if ({a} != NULL && {a}->len > {n}) {{ free({a}->buf); }}",
    "import numpy as np\n{a} = np.zeros(({n}, {n}), dtype=np.float32)",
    "git commit -m \"fix {f}: handle empty {a}\" && git push origin main",
    "<{a} class=\"{b}\" data-id=\"{n}\">{f}</{a}>",
    "{{\"{a}\": {n}, \"{b}\": [\"{f}\", null, true]}}",
    "fn {f}(&self, {a}: u32) -> Option<u32> {{ self.{b}.get({a} as usize).copied() }}",
)

IDENTIFIERS = ("x", "idx", "total", "user_id", "buf", "row", "span", "price", "items", "node", "acc", "div")
WORDS = ("quantum", "harbor", "velvet", "ledger", "orbit", "meadow", "cipher", "lantern", "ember", "granite",
         "falcon", "tundra", "mosaic", "signal", "pepper", "rivet", "saffron", "beacon", "canyon", "willow")
QUERIES: tuple[str, ...] = (
    "how to fix a flat bicycle tyre", "symptoms of vitamin D deficiency", "best time to visit Kyoto",
    "what does a neural network learn", "cheap vegetarian dinner ideas", "how do vaccines work",
    "python read csv file", "history of the Roman empire", "train tickets Berlin to Prague",
    "why is the sky blue", "how to negotiate a salary", "wie funktioniert eine Wärmepumpe",
    "recette de crêpes facile", "cómo aprender a programar", "東京 おすすめ 観光地",
    "interest rate forecast 2027", "remove red wine stain", "symptoms of burnout at work",
    "how long to boil pasta", "difference between TCP and UDP",
)


def _number(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return f"{rng.uniform(-1e4, 1e4):,.2f}"
    if kind == 1:
        return f"{rng.randrange(1990, 2030)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if kind == 2:
        return f"{rng.uniform(0, 100):.1f}%"
    if kind == 3:
        return f"+{rng.randrange(1, 99)} {rng.randrange(100, 999)} {rng.randrange(1000, 9999)}"
    return f"{rng.random():.6e}"


def _code(rng: random.Random) -> str:
    template = rng.choice(CODE)
    a, b, f = rng.sample(IDENTIFIERS, 3)
    return template.format(a=a, b=b, f=f, n=rng.randrange(2, 500))


def _near_duplicate(text: str, rng: random.Random) -> str:
    """One small edit: a dropped or doubled character, a case change, a swapped pair of words, or punctuation."""
    kind = rng.randrange(4)
    if kind == 0 and len(text) > 3:
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1:] if rng.random() < 0.5 else text[:i] + text[i] + text[i:]
    if kind == 1:
        return text.upper() if rng.random() < 0.5 else text.lower()
    words = text.split()
    if kind == 2 and len(words) > 2:
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
        return " ".join(words)
    return text.rstrip(".!?") + rng.choice(("?", "!!", " ...", ";"))


def _long(rng: random.Random, words: int) -> str:
    parts: list[str] = []
    while sum(len(p.split()) for p in parts) < words:
        parts.append(rng.choice(SENTENCES) if rng.random() < 0.8 else _number(rng))
    return " ".join(parts)


def singles(size: int = SIZE, seed: int = SEED) -> list[str]:
    """`size` texts: short (one token, one word), sentences, languages, code, numbers, near-duplicates, long."""
    rng = random.Random(seed)
    texts = ["z", "Yes", "?", "42", "🙂", "東", rng.choice(WORDS), " ".join(rng.sample(WORDS, 2))]
    texts += list(SENTENCES)
    makers = (
        lambda: _near_duplicate(rng.choice(SENTENCES), rng),
        lambda: _code(rng),
        lambda: f"{rng.choice(SENTENCES)[:-1]} ({_number(rng)}, {_number(rng)}).",
        lambda: " ".join(_number(rng) for _ in range(rng.randrange(3, 12))),
        lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 6))),
        lambda: _long(rng, rng.choice((30, 60, 120, 200))),
        lambda: _long(rng, rng.choice((300, 600))),  # beyond a 256 or 512 token maximum: truncated
        lambda: rng.choice(SENTENCES) + " " + rng.choice(SENTENCES),
    )
    seen, turn = set(texts), 0
    while len(texts) < size:
        text = makers[turn % len(makers)]()
        turn += 1
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts[:size]


def pairs(size: int = SIZE, seed: int = SEED) -> list[tuple[str, str]]:
    """Queries each followed by a run of candidates (ranking groups runs by query): related, unrelated, long."""
    rng = random.Random(seed + 1)
    candidates = singles(size, seed + 2)
    result: list[tuple[str, str]] = []
    while len(result) < size:
        query = rng.choice(QUERIES)
        if rng.random() < 0.3:
            query = _near_duplicate(query, rng)
        result.extend((query, text) for text in rng.sample(candidates, rng.randrange(4, 9)))
    return result[:size]


def select(kind: Kind, texts: tuple[str, ...], text_pairs: tuple[tuple[str, str], ...]) -> list[TextInput]:
    if kind == "pairs":
        return list(text_pairs)
    if kind == "both":
        return [*texts, *text_pairs]
    return list(texts)


def probe_inputs(kind: Kind) -> list[TextInput]:
    return select(kind, SINGLES, PAIRS)


def calibration_inputs(kind: Kind) -> list[TextInput]:
    return select(kind, CALIBRATION_SINGLES, CALIBRATION_PAIRS)


def heldout_inputs(kind: Kind) -> list[TextInput]:
    return generated(kind, SIZE, SEED)


def tuning_inputs(kind: Kind, size: int = TUNING_SIZE) -> list[TextInput]:
    """More inputs for the fallback search, from the same generator with another seed: none of them is a
    held-out input (a ranking group whose query the held-out set has keeps only pairs it lacks)."""
    heldout = set(heldout_inputs(kind))
    fresh = [item for item in generated(kind, size + 2 * len(SENTENCES), SEED + 1000) if item not in heldout]
    return fresh[:size]


def generated(kind: Kind, size: int, seed: int) -> list[TextInput]:
    if kind == "pairs":
        return list(pairs(size, seed))
    if kind == "both":
        return [*singles(size - size * 3 // 11, seed), *pairs(size * 3 // 11, seed)]
    return list(singles(size, seed))


HELDOUT_DESCRIPTION = (f"held-out validation set (optimize/measure/texts.py, seed {SEED}): texts no search or "
                       "calibration step saw; each input alone and inside shuffled mixed-length batches up to the "
                       "server's limits")
