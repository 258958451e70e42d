"""Writes bench/data/cache_eval.json: a small multi-domain corpus and labelled retrieval queries.

Every query carries its intent (domain + the facet values that decide the answer). Queries of one
intent are paraphrases that should share evidence; queries whose intents differ in one facet are
near misses that must not (plan types, billing periods, regions, numbers, negation, direction,
entities, time periods). Deterministic; run `python bench/data/make_cache_eval.py` to regenerate.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import random

OUT = pathlib.Path(__file__).with_name("cache_eval.json")
rng = random.Random(20261130)
docs: list[dict] = []
queries: list[dict] = []


def doc(domain: str, intent: dict, text: str, meta: dict) -> None:
    docs.append({"id": f"{domain}-{len(docs):03d}", "domain": domain, "intent": intent, "text": text, "metadata": meta})


def ask(domain: str, intent: dict, texts: list[str], filters: dict | None = None) -> None:
    for t in texts:
        queries.append({"text": t, "domain": domain, "intent": intent, "filters": filters})


def pick(options: list[str], n: int) -> list[str]:
    return rng.sample(options, min(n, len(options)))


# --- billing: plan x cycle x topic (5 documents per topic: the starter plan is monthly only) ----------
PLAN = {"starter": "Starter", "pro": "Pro", "enterprise": "Enterprise"}
CYCLE = {"monthly": ("monthly", "month-to-month", "billed every month", "per month"),
         "annual": ("annual", "yearly", "billed once a year", "per year")}
TOPIC = {"refund": "Refund window, refund period, refund deadline, money back",
         "cancel": "Cancel, cancellation, terminate a subscription",
         "upgrade": "Upgrade, upgrading, proration of an upgrade"}
for plan, cycle, topic in itertools.product(PLAN, CYCLE, TOPIC):
    if plan == "starter" and cycle == "annual":
        continue
    days = {"refund": 14, "cancel": 30, "upgrade": 7}[topic] + 3 * list(PLAN).index(plan) + (5 if cycle == "annual" else 0)
    P, c = PLAN[plan], CYCLE[cycle][0]
    cw = ", ".join(CYCLE[cycle])
    body = {
        "refund": f"customers on a {c} {P} subscription can ask for a full refund within {days} days of the charge.",
        "cancel": f"a {P} subscription on {c} billing can be cancelled at any time; access continues for {days} days.",
        "upgrade": f"the {c} {P} subscription can be upgraded at once; the price difference is prorated over {days} days.",
    }[topic]
    doc("billing", {"plan": plan, "cycle": cycle, "topic": topic},
        f"{TOPIC[topic]}. {P} plan, {c} billing ({cw}): {body}", {"plan": plan, "billing": cycle})
    c0, c1, c2, c3 = CYCLE[cycle]
    forms = {
        "refund": [f"refund window for {c0} {plan} plans", f"refund period for {c1} {plan} subscriptions",
                   f"how long do I have to get a refund on the {plan} plan {c2}",
                   f"{plan} plan {c3} refund deadline", f"can I get my money back on a {c0} {plan} subscription",
                   f"refund policy for the {plan} tier paid {c3}"],
        "cancel": [f"how do I cancel a {c0} {plan} plan", f"cancel my {c1} {plan} subscription",
                   f"cancellation of the {plan} plan {c2}", f"terminate {plan} subscription paid {c3}",
                   f"what happens when I cancel the {c0} {plan} tier"],
        "upgrade": [f"upgrade from the {c0} {plan} plan", f"how to upgrade a {c1} {plan} subscription",
                    f"upgrading my {plan} plan {c2}", f"{plan} plan {c3} upgrade proration"],
    }[topic]
    ask("billing", {"plan": plan, "cycle": cycle, "topic": topic}, pick(forms, 4))

# --- hr: employment type x topic, region as a filter (5 documents per topic and region) -------------
EMP = {"full-time": ("full-time employees", "full-time staff", "people working full-time"),
       "part-time": ("part-time employees", "part-time staff", "people working part-time"),
       "contractor": ("contractors", "freelancers", "contractors on our team"),
       "intern": ("interns", "summer interns", "people on an internship"),
       "senior": ("senior employees", "senior staff", "people in senior roles")}
HR_TOPIC = {"pto": "Paid time off, PTO, vacation days, annual leave allowance",
            "sick": "Sick leave, paid sick days, being ill",
            "remote": "Remote work, work from home, remote days"}
for region, emp, topic in itertools.product(("emea", "us"), EMP, HR_TOPIC):
    n = {"pto": 25, "sick": 10, "remote": 2}[topic] + list(EMP).index(emp) * 2 + (3 if region == "emea" else 0)
    e = EMP[emp]
    body = {
        "pto": f"{e[0]} accrue {n} vacation days per year. Unused vacation carries over.",
        "sick": f"{e[0]} get {n} paid sick days per year; a doctor's note is needed after three days.",
        "remote": f"{e[0]} may work from home {n} days a week with manager approval.",
    }[topic]
    doc("hr", {"region": region, "emp": emp, "topic": topic},
        f"{HR_TOPIC[topic]} for {', '.join(e)}: {body}", {"region": region, "employment": emp})
    a, b, c = EMP[emp]
    forms = {
        "pto": [f"how many vacation days do {a} get", f"PTO allowance for {b}", f"paid time off for {c}",
                f"annual leave entitlement of {a}"],
        "sick": [f"sick leave for {a}", f"how many paid sick days do {b} have", f"sick day policy for {c}",
                 f"do {a} get paid when ill"],
        "remote": [f"can {a} work from home", f"remote work policy for {b}", f"work from home days for {c}",
                   f"how many remote days per week for {a}"],
    }[topic]
    ask("hr", {"region": region, "emp": emp, "topic": topic}, pick(forms, 4), {"region": region})

# --- travel: directed routes x topic (5 routes: Tokyo -> Sydney has no return flight) --------------
ROUTES = [("Paris", "London"), ("London", "Paris"), ("Berlin", "Madrid"), ("Madrid", "Berlin"), ("Tokyo", "Sydney")]
T_TOPIC = {"baggage": "Baggage allowance, luggage, checked bag limit, baggage rules",
           "duration": "Flight time, flight duration, how long, hours flying"}
for (src, dst), topic in itertools.product(ROUTES, T_TOPIC):
    i = ROUTES.index((src, dst))
    fact = {"baggage": f"the checked baggage allowance is {20 + 2 * i} kg per passenger.",
            "duration": f"the flight takes about {1 + i} hours non-stop."}[topic]
    doc("travel", {"from": src, "to": dst, "topic": topic},
        f"{T_TOPIC[topic]}. Departing {src}, arriving {dst} (flights from {src} to {dst}): {fact}",
        {"origin": src, "destination": dst})
    forms = {"baggage": [f"baggage allowance on flights from {src} to {dst}", f"how much luggage can I take flying from {src} to {dst}",
                         f"checked bag limit {src} to {dst} flight", f"{src} to {dst} flight baggage rules"],
             "duration": [f"how long is the flight from {src} to {dst}", f"flight time from {src} to {dst}",
                          f"duration of a {src} to {dst} flight", f"hours flying from {src} to {dst}"]}[topic]
    ask("travel", {"from": src, "to": dst, "topic": topic}, pick(forms, 4))

# --- banking: one section per filter; direction, thresholds, terms, negation ------------------------
for src, dst in (("checking", "savings"), ("savings", "checking")):
    fee = 0 if src == "checking" else 3
    doc("banking", {"t": "move", "from": src, "to": dst},
        f"Transfer, move funds, transferring money out of your {src} account into your {dst} account "
        f"(from {src} to {dst}): the fee is ${fee} and money arrives the same day.",
        {"section": "transfers", "from_account": src, "to_account": dst})
    ask("banking", {"t": "move", "from": src, "to": dst},
        [f"transfer money from {src} to {dst}", f"how do I move funds from my {src} account to {dst}",
         f"fee for transferring from {src} into {dst}"], {"section": "transfers"})
for amount, side in itertools.product((1000, 10000), ("above", "below")):
    fee = {"above": 25, "below": 10}[side] + (15 if amount == 10000 else 0)
    word = {"above": ("above", "over", "more than"), "below": ("below", "under", "less than")}[side]
    doc("banking", {"t": "wire", "amount": amount, "side": side},
        f"Wire transfer fees, cost of a wire {', '.join(word)} ${amount:,} ({amount} dollars): a wire {side} "
        f"${amount:,} costs ${fee}.", {"section": "wires", "wire_band": f"{side}-{amount}"})
    ask("banking", {"t": "wire", "amount": amount, "side": side},
        [f"wire transfer fee {word[0]} ${amount:,}", f"cost of a wire {word[1]} {amount} dollars",
         f"fees for wires of {word[2]} ${amount}"], {"section": "wires"})
for years in (1, 3, 5):
    rate = {1: 3.1, 3: 3.6, 5: 4.0}[years]
    yw = {1: "one", 3: "three", 5: "five"}[years]
    doc("banking", {"t": "cd", "years": years},
        f"Certificate of deposit (CD) interest rate and APY, {years}-year term ({yw} year): a {years} year CD "
        f"pays {rate}% APY.", {"section": "deposits", "term": f"{years}y"})
    ask("banking", {"t": "cd", "years": years},
        [f"interest rate on a {years}-year CD", f"{yw} year certificate of deposit rate",
         f"what APY does the {years} year CD pay"], {"section": "deposits"})
for neg in (False, True):
    doc("banking", {"t": "overdraft", "neg": neg},
        ("Accounts without overdraft protection (no overdraft protection, do not have it): declined payments "
         "are not charged, but checks bounce." if neg else
         "Accounts with overdraft protection (have overdraft protection): payments go through and a $12 fee "
         "applies."), {"section": "overdraft", "overdraft": "off" if neg else "on"})
    ask("banking", {"t": "overdraft", "neg": neg},
        (["what happens to payments without overdraft protection", "fees if I do not have overdraft protection",
          "accounts with no overdraft protection declined payments"] if neg else
         ["what happens to payments with overdraft protection", "fees if I have overdraft protection",
          "accounts that have overdraft protection declined payments"]), {"section": "overdraft"})

# --- devops: platform x version x action (5 documents per action: macOS has version 3 only) ----------
OSES = {"linux": "Linux", "windows": "Windows", "macos": "macOS"}
for os_, ver, action in itertools.product(OSES, ("2", "3"), ("install", "uninstall")):
    if os_ == "macos" and ver == "2":
        continue
    OS = OSES[os_]
    cmd = {"linux": "apt", "windows": "winget", "macos": "brew"}[os_]
    verb = {"install": ("install", "set up", "installing"), "uninstall": ("uninstall", "remove", "uninstalling")}[action]
    doc("devops", {"os": os_, "ver": ver, "action": action},
        f"{', '.join(verb).capitalize()} Acme Agent {ver} (version {ver}) on {OS}: run `{cmd} "
        f"{'install' if action == 'install' else 'remove'} acme-agent{ver}`.", {"os": os_, "version": f"v{ver}"})
    ask("devops", {"os": os_, "ver": ver, "action": action},
        [f"how to {verb[0]} Acme Agent {ver} on {OS}", f"{verb[1]} acme agent version {ver} on {OS}",
         f"{verb[2]} the Acme Agent {ver} for {OS}", f"Acme Agent {ver} {verb[0]} steps {OS}"])

# --- shop: sections as filters; product model x storage, shipping regions, support days -------------
for model, gb, topic in itertools.product(("Nova X10", "Nova X20"), (128, 256), ("price", "battery")):
    price = 499 + (200 if model.endswith("20") else 0) + (100 if gb == 256 else 0)
    body = {"price": f"Price and cost: the {model} with {gb}GB ({gb} GB, {gb} gigabyte) storage costs ${price}.",
            "battery": f"Battery life, hours per charge: the {model} {gb}GB ({gb} GB, {gb} gigabyte) model lasts "
                       f"{20 + gb // 64} hours."}[topic]
    doc("shop", {"model": model, "gb": gb, "topic": topic}, body,
        {"section": "phones", "model": model, "storage": f"{gb}GB"})
    forms = {"price": [f"price of the {model} {gb}GB", f"how much does the {model} with {gb} GB cost",
                       f"{model} {gb} gigabyte cost"],
             "battery": [f"battery life of the {model} {gb}GB", f"how long does the {model} {gb} GB battery last",
                         f"{model} {gb}GB hours per charge"]}[topic]
    ask("shop", {"model": model, "gb": gb, "topic": topic}, forms, {"section": "phones"})
for country in ("Canada", "Mexico", "Germany"):
    days = {"Canada": 4, "Mexico": 6, "Germany": 9}[country]
    doc("shop", {"ship": country}, f"Shipping and delivery time to {country}: orders ship to {country} in "
        f"{days} business days.", {"section": "shipping", "country": country})
    ask("shop", {"ship": country}, [f"shipping time to {country}", f"how long does delivery to {country} take",
                                    f"ship an order to {country}"], {"section": "shipping"})
for when in ("weekday", "weekend"):
    doc("shop", {"support": when}, f"Support hours, help desk and customer service opening times on {when}s: "
        f"calls are answered from {'8' if when == 'weekday' else '10'} to 6.", {"section": "support", "support": when})
    ask("shop", {"support": when}, [f"support hours on {when}s", f"when is the help desk open on {when}s",
                                    f"customer service {when} opening times"], {"section": "support"})

OUT.write_text(json.dumps({"docs": docs, "queries": queries}, indent=1) + "\n")
print(f"{len(docs)} docs, {len(queries)} queries -> {OUT}")
