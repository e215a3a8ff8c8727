"""The built-in probe set: texts that stress what quantization and export tend to break."""
from __future__ import annotations

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
