"""The built-in probe set: texts that stress what quantization and export tend to break."""
from __future__ import annotations

from infinity.engine.tokenization import TextInput

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


def probe_inputs(task: str) -> list[TextInput]:
    return for_task(task, SINGLES, PAIRS)


def for_task(task: str, singles: tuple[str, ...], pairs: tuple[tuple[str, str], ...]) -> list[TextInput]:
    if task == "ranking":
        return list(pairs)
    if task == "sequence-classification":
        return [*singles, *pairs]
    return list(singles)
