"""The held-out validation set: texts no search or calibration step ever sees, generated with a fixed seed.

Manifest parity is measured on these only. They cover one token to beyond the maximum length, many
languages and scripts, code, numbers, and near-duplicates (one edit apart), for every task.
"""
from __future__ import annotations

import random

from infinity.engine.tokenization import TextInput

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


def heldout_inputs(task: str) -> list[TextInput]:
    return _generated(task, SIZE, SEED)


def tuning_inputs(task: str, size: int = TUNING_SIZE) -> list[TextInput]:
    """More inputs for the fallback search, from the same generator with another seed: none of them is a
    held-out input (a ranking group whose query the held-out set has keeps only pairs it lacks)."""
    heldout = set(heldout_inputs(task))
    fresh = [item for item in _generated(task, size + 2 * len(SENTENCES), SEED + 1000) if item not in heldout]
    return fresh[:size]


def _generated(task: str, size: int, seed: int) -> list[TextInput]:
    if task == "ranking":
        return list(pairs(size, seed))
    if task == "sequence-classification":
        return [*singles(size - size * 3 // 11, seed), *pairs(size * 3 // 11, seed)]
    return list(singles(size, seed))

HELDOUT_DESCRIPTION = (f"held-out validation set (optimize/validate/heldout.py, seed {SEED}): texts no search or "
                       "calibration step saw; each input alone and inside shuffled mixed-length batches up to the "
                       "server's limits")
