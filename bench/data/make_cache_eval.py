"""Writes bench/data/cache_eval.json: a small multi-domain corpus and labelled retrieval queries.

Every query carries its intent (domain + the facet values that decide the answer). Queries of one
intent are paraphrases that should share evidence; queries whose intents differ in one facet are
near misses that must not (plan types, tiers, billing periods, regions, numbers, doses, age groups,
negation, direction and its order, entities, time periods). Deterministic; run `python bench/data/make_cache_eval.py`
to regenerate.
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

# The domains above come first and are generated exactly as before; the ones below were added later
# and draw from the same rng only after them, so the earlier queries and documents stay the same.
OLD_QUERIES = len(queries)

# --- logistics: sections as filters; destination x service x topic, parcel weights, duties by direction,
# signature on delivery --------------------------------------------------------------------------------
DEST = {"UK": ("the UK", "the United Kingdom", "UK"), "Japan": ("Japan", "Japan", "Japan"),
        "Brazil": ("Brazil", "Brazil", "Brazil")}
SERVICE = {"standard": ("standard", "regular", "economy"), "express": ("express", "expedited", "fast")}
L_TOPIC = {"time": "Delivery time, transit time, how many days until it arrives",
           "cost": "Shipping rates, price, cost of sending a parcel"}
for country, service, topic in itertools.product(DEST, SERVICE, L_TOPIC):
    i = list(DEST).index(country)
    fast = service == "express"
    days = (2 + i, 3 + 2 * i) if fast else (5 + 3 * i, 8 + 4 * i)
    price = (24 + 9 * i) if fast else (11 + 5 * i)
    c0, c1, c2 = DEST[country]
    s0, s1, s2 = SERVICE[service]
    fact = {"time": f"{s0} parcels to {c0} arrive in {days[0]} to {days[1]} business days.",
            "cost": f"{s0} shipping of a parcel up to 2 kg to {c0} costs ${price}."}[topic]
    doc("logistics", {"country": country, "service": service, "topic": topic},
        f"{L_TOPIC[topic]}. {s0.capitalize()} international shipping ({', '.join(SERVICE[service])}) to "
        f"{c0}{f' ({c1})' if c1 != c0 else ''}: {fact}", {"section": "international", "country": country, "service": service})
    forms = {"time": [f"how long does {s0} shipping to {c0} take", f"{s1} delivery time to {c1}",
                      f"how many days for {s2} parcels to reach {c0}", f"transit time for {s0} shipments to {c2}",
                      f"when will my {s1} package to {c0} arrive"],
             "cost": [f"how much is {s0} shipping to {c0}", f"{s1} shipping rates to {c1}",
                      f"price of sending a parcel to {c0} by {s0} shipping", f"what does {s2} delivery to {c0} cost",
                      f"{c2} {s0} shipping cost"]}[topic]
    ask("logistics", {"country": country, "service": service, "topic": topic}, pick(forms, 4),
        {"section": "international"})
for kg in (1, 5, 20):
    price = {1: 7, 5: 16, 20: 41}[kg]
    doc("logistics", {"t": "weight", "kg": kg},
        f"Domestic parcel rates by weight, price for a {kg} kg ({kg} kilogram) parcel: sending a {kg} kg parcel "
        f"within the country costs ${price}.", {"section": "domestic", "weight": f"{kg}kg"})
    ask("logistics", {"t": "weight", "kg": kg},
        [f"cost to ship a {kg} kg parcel", f"how much is postage for a {kg} kilogram package",
         f"price of sending a {kg}kg box domestically", f"{kg} kg parcel shipping rate"], {"section": "domestic"})
NAMED = {"US": "the US", "Canada": "Canada"}
for src, dst in (("US", "Canada"), ("Canada", "US")):
    limit = {"Canada": "CAD 150", "US": "USD 800"}[dst]
    a, b = NAMED[src], NAMED[dst]
    doc("logistics", {"t": "duties", "from": src, "to": dst},
        f"Customs duties, import tax and duty-free limits on parcels sent from {a} to {b} (shipping from {src} "
        f"into {dst}): parcels worth up to {limit} enter {b} duty free; above that the receiver pays import duty.",
        {"section": "customs", "origin": src, "destination": dst})
    ask("logistics", {"t": "duties", "from": src, "to": dst},
        [f"customs duties on packages from {a} to {b}",
         f"do I pay import tax when sending a parcel from {a} to {b}",
         f"duty free limit for shipments from {a} into {b}",
         f"{dst} import duties on parcels shipped from {a}"], {"section": "customs"})
for neg in (False, True):
    doc("logistics", {"t": "signature", "neg": neg},
        ("Deliveries without a signature (no signature needed, signature not required): if nobody is home, "
         "the courier leaves the parcel at the door or in a safe place and sends a photo." if neg else
         "Deliveries that need a signature (signature required): if nobody is home, the parcel goes back to "
         "the local depot and can be collected within 7 days."),
        {"section": "delivery", "signature": "no" if neg else "yes"})
    ask("logistics", {"t": "signature", "neg": neg},
        (["where is my parcel left if no signature is needed", "delivery without a signature when nobody is home",
          "what happens to a parcel that doesn't need a signature if I'm out",
          "parcels with no signature required, where do they get left"] if neg else
         ["what happens if I'm not home for a delivery that needs a signature",
          "missed a delivery that requires a signature",
          "signature required parcel and nobody was home",
          "where does a parcel that needs a signature go if I'm out"]), {"section": "delivery"})

# --- insurance: product as a filter; tier x topic per product, driver age, renewal year, flood add-on ----
PRODUCT = {"auto": ("car insurance", "auto insurance", "car cover"),
           "home": ("home insurance", "homeowners insurance", "house insurance")}
TIER = {"bronze": "Bronze", "silver": "Silver", "gold": "Gold"}
I_TOPIC = {"deductible": "Deductible, excess, the amount you pay per claim",
           "limit": "Coverage limit, maximum payout, how much the policy covers"}
for product, tier, topic in itertools.product(PRODUCT, TIER, I_TOPIC):
    i = list(TIER).index(tier)
    p0, p1, p2 = PRODUCT[product]
    T = TIER[tier]
    fact = {"deductible": f"the deductible is ${[1000, 500, 250][i] * (2 if product == 'home' else 1):,} per claim.",
            "limit": f"claims are paid up to ${[50, 150, 500][i] * (3 if product == 'home' else 1):,},000 a year."}[topic]
    doc("insurance", {"product": product, "tier": tier, "topic": topic},
        f"{I_TOPIC[topic]}. {T} tier {p0} policy ({p1}, {p2}): {fact}", {"product": product, "tier": tier})
    forms = {"deductible": [f"what is the deductible on {tier} {p0}", f"{tier} {p1} deductible amount",
                            f"how much do I pay per claim on the {tier} {p2} plan",
                            f"excess for a {tier} {p0} policy", f"deductible for the {tier} tier of {p1}"],
             "limit": [f"coverage limit of {tier} {p0}", f"what is the maximum payout on a {tier} {p1} policy",
                       f"how much does {tier} {p2} pay out", f"{tier} {p0} claim limit",
                       f"max coverage amount for the {tier} {p1} plan"]}[topic]
    ask("insurance", {"product": product, "tier": tier, "topic": topic}, pick(forms, 4), {"product": product})
for side in ("under", "over"):
    doc("insurance", {"t": "age", "side": side},
        ("Young driver surcharge, age of the driver: drivers under 25 (younger than 25) pay a surcharge of "
         "$300 a year on car insurance." if side == "under" else
         "Driver age and price: drivers over 25 (older than 25) pay no age surcharge on car insurance; the "
         "standard rate applies."), {"product": "auto", "driver_age": f"{side}-25"})
    ask("insurance", {"t": "age", "side": side},
        (["surcharge for drivers under 25", "does car insurance cost more for drivers younger than 25",
          "young driver fee under 25", "insurance price for a driver aged under 25"] if side == "under" else
         ["surcharge for drivers over 25", "does car insurance cost more for drivers older than 25",
          "age fee for drivers above 25", "insurance price for a driver aged over 25"]),
        {"product": "auto"})
for year in (2024, 2025):
    rise = {2024: 6, 2025: 9}[year]
    doc("insurance", {"t": "renewal", "year": year},
        f"Renewal price increase, premium change at renewal in {year}: home insurance premiums renewed in "
        f"{year} rose {rise}% on average.", {"product": "home", "renewal_year": str(year)})
    ask("insurance", {"t": "renewal", "year": year},
        [f"how much did home insurance go up at the {year} renewal", f"home insurance renewal price increase {year}",
         f"{year} homeowners insurance premium increase", f"by how much did house insurance premiums rise in {year}"],
        {"product": "home"})
for neg in (False, True):
    doc("insurance", {"t": "flood", "neg": neg},
        ("Flood damage on policies without the flood add-on (no flood cover): flooding from outside is not "
         "covered; burst pipes still are." if neg else
         "Flood damage on policies with the flood add-on (flood cover added): flooding from outside is covered "
         "up to $100,000 after the deductible."), {"product": "home", "flood_addon": "no" if neg else "yes"})
    ask("insurance", {"t": "flood", "neg": neg},
        (["is flood damage covered without the flood add-on", "flood claims if I did not buy flood cover",
          "does my home insurance pay for flooding if I don't have the flood extension",
          "house flooded and no flood add-on on the policy"] if neg else
         ["is flood damage covered with the flood add-on", "flood claims when I bought flood cover",
          "does my home insurance pay for flooding if I have the flood extension",
          "house flooded and the policy has the flood add-on"]), {"product": "home"})

# --- pharmacy: made-up medicines; medicine x age group doses, tablet strength, food, supply length ------
MEDS = {"Dolorin": "pain reliever", "Fevanol": "fever reducer", "Tussex": "cough syrup"}
AGE = {"adult": ("adults", "an adult", "grown-ups"), "child": ("children", "a child", "kids"),
       "senior": ("people over 65", "a patient over 65", "seniors")}
for med, group in itertools.product(MEDS, AGE):
    i, j = list(MEDS).index(med), list(AGE).index(group)
    unit = "ml" if med == "Tussex" else "mg"
    dose = [[400, 200, 200], [500, 250, 500], [10, 5, 5]][i][j]
    hours = [6, 8, 8][j] + (2 if med == "Fevanol" else 0)
    g0, g1, g2 = AGE[group]
    doc("pharmacy", {"med": med, "group": group},
        f"Dosage, dose, how much to take: {med} ({MEDS[med]}) for {', '.join(AGE[group])}: {dose} {unit} every "
        f"{hours} hours, at most {dose * (24 // hours)} {unit} a day.", {"medicine": med, "age_group": group})
    forms = [f"{med} dosage for {g0}", f"how much {med} can I give {g1}", f"recommended dose of {med} for {g2}",
             f"how many {unit} of {med} for {g1}", f"{med} dose {g0}", f"what's the right amount of {med} for {g2}"]
    ask("pharmacy", {"med": med, "group": group}, pick(forms, 4))
for mg in (200, 400):
    doc("pharmacy", {"t": "strength", "mg": mg},
        f"Dolorin {mg} mg tablets ({mg}mg strength), how many tablets per dose: adults take "
        f"{'two tablets' if mg == 200 else 'one tablet'} at a time.", {"medicine": "Dolorin", "strength": f"{mg}mg"})
    ask("pharmacy", {"t": "strength", "mg": mg},
        [f"how many Dolorin {mg} mg tablets can I take at once", f"Dolorin {mg}mg how many pills per dose",
         f"number of {mg} mg Dolorin tablets per dose", f"should I take one or two Dolorin {mg} mg tablets"])
for neg in (False, True):
    doc("pharmacy", {"t": "food", "neg": neg},
        ("Taking Fevanol without food, on an empty stomach: it starts working in about 30 minutes but can upset "
         "the stomach." if neg else
         "Taking Fevanol with food, after a meal: it is gentler on the stomach and starts working in about an hour."),
        {"medicine": "Fevanol", "with_food": "no" if neg else "yes"})
    ask("pharmacy", {"t": "food", "neg": neg},
        (["can I take Fevanol without food", "Fevanol on an empty stomach", "taking Fevanol without eating first",
          "is it ok to take Fevanol before eating anything"] if neg else
         ["can I take Fevanol with food", "Fevanol after a meal", "taking Fevanol together with food",
          "is it ok to take Fevanol while eating"]))
for supply in (30, 90):
    doc("pharmacy", {"t": "supply", "days": supply},
        f"Prescription refill price, cost of a {supply}-day supply ({supply} days) of Cardiva: "
        f"${12 if supply == 30 else 30} with insurance.", {"medicine": "Cardiva", "supply": f"{supply}d"})
    months = {30: "one month", 90: "three month"}[supply]
    ask("pharmacy", {"t": "supply", "days": supply},
        [f"cost of a {supply}-day supply of Cardiva", f"how much is a {months} supply of Cardiva",
         f"Cardiva {supply} day refill price", f"what does a {supply}-day Cardiva prescription cost"])

# --- courses: subject x level x topic, registration by semester, dropping a course before/after week 4 --
SUBJECT = {"calculus": ("Calculus", "MATH"), "statistics": ("Statistics", "STAT"), "programming": ("Programming", "CS")}
LEVEL = {"intro": ("introductory", "intro", "101"), "advanced": ("advanced", "upper-level", "301")}
C_TOPIC = {"prereq": "Prerequisites, requirements, courses you need first",
           "credits": "Credits, credit hours, weekly workload"}
for subject, level, topic in itertools.product(SUBJECT, LEVEL, C_TOPIC):
    i = list(SUBJECT).index(subject)
    S, dept = SUBJECT[subject]
    l0, l1, num = LEVEL[level]
    code, intro_code = f"{dept} {num}", f"{dept} 101"
    adv = level == "advanced"
    fact = {"prereq": (f"requires {intro_code} with a grade of C or better." if adv else
                       "no prerequisites; high-school algebra is enough."),
            "credits": f"{4 if adv else 3} credits, about {[6, 5, 8][i] + (3 if adv else 0)} hours of work a week."}[topic]
    doc("courses", {"subject": subject, "level": level, "topic": topic},
        f"{C_TOPIC[topic]}. {l0.capitalize()} {S} ({code}, {l1} {subject}): {fact}",
        {"subject": subject, "level": level, "code": code})
    forms = {"prereq": [f"prerequisites for {l0} {subject}", f"what do I need to take before {l1} {subject}",
                        f"{code} prerequisites", f"requirements to enroll in {l0} {subject}",
                        f"can I sign up for {l1} {subject} without taking other courses first"],
             "credits": [f"how many credits is {l0} {subject}", f"{code} credit hours",
                         f"credit value of {l1} {subject}", f"how many hours a week does {l0} {subject} take",
                         f"{l1} {subject} workload"]}[topic]
    ask("courses", {"subject": subject, "level": level, "topic": topic}, pick(forms, 4))
for term in ("fall", "spring", "summer"):
    opens, closes = {"fall": ("April 15", "August 30"), "spring": ("November 1", "January 20"),
                     "summer": ("March 1", "May 31")}[term]
    doc("courses", {"t": "registration", "term": term},
        f"Registration dates, enrollment period, signing up for {term} semester classes: registration for the "
        f"{term} semester opens {opens} and closes {closes}.", {"semester": term})
    forms = [f"when does registration open for the {term} semester", f"{term} semester enrollment dates",
             f"registration deadline for the {term} term", f"when can I sign up for {term} classes"]
    if term == "fall":
        forms.append("autumn semester course registration period")
    ask("courses", {"t": "registration", "term": term}, pick(forms, 4))
for when in ("before", "after"):
    doc("courses", {"t": "drop", "when": when},
        ("Dropping or withdrawing from a course before week 4 (before the fourth week): full tuition refund, and "
         "the course does not appear on the transcript." if when == "before" else
         "Dropping or withdrawing from a course after week 4 (after the fourth week): no tuition refund, and a W "
         "appears on the transcript."), {"drop_period": f"{when}-week-4"})
    ask("courses", {"t": "drop", "when": when},
        [f"refund if I drop a course {when} week 4", f"dropping a class {when} the fourth week",
         f"tuition refund for withdrawing {when} week 4", f"what happens if I withdraw from a course {when} week 4"])

# --- telecom: sections as filters; plan x topic, roaming region x plan type, contract length, call direction
PLANS = {"lite": "Lite", "plus": "Plus", "max": "Max"}
M_TOPIC = {"data": "Data allowance, GB per month, data cap",
           "hotspot": "Hotspot, tethering, sharing your phone's connection",
           "price": "Price, monthly cost, what you pay"}
for plan, topic in itertools.product(PLANS, M_TOPIC):
    i = list(PLANS).index(plan)
    P = PLANS[plan]
    fact = {"data": f"{[5, 30, 100][i]} GB of data per month; after that, speeds drop to 1 Mbps.",
            "hotspot": ("hotspot and tethering are not included." if plan == "lite" else
                        f"hotspot is included, up to {[0, 10, 40][i]} GB a month."),
            "price": f"the plan costs £{[10, 20, 35][i]} a month."}[topic]
    doc("telecom", {"plan": plan, "topic": topic}, f"{M_TOPIC[topic]}. {P} mobile plan: {fact}",
        {"section": "plans", "plan": plan})
    forms = {"data": [f"how much data do I get on the {P} plan", f"{P} plan data allowance", f"monthly data cap on {P}",
                      f"how many GB per month with the {P} plan", f"what's the data limit of the {P} mobile plan"],
             "hotspot": [f"can I use hotspot on the {P} plan", f"tethering on {P}", f"{P} plan hotspot data",
                         f"is sharing my phone's connection allowed on the {P} plan",
                         f"how much hotspot data comes with {P}"],
             "price": [f"how much does the {P} plan cost", f"{P} plan monthly price",
                       f"price of the {P} mobile plan per month", f"what do I pay each month for {P}"]}[topic]
    ask("telecom", {"plan": plan, "topic": topic}, pick(forms, 4), {"section": "plans"})
REGION = {"EU": ("the EU", "Europe", "EU"), "US": ("the USA", "the US", "USA"), "Asia": ("Asia", "Asia", "Asia")}
PAY = {"prepaid": ("prepaid", "pay as you go", "prepaid"), "contract": ("contract", "monthly contract", "contract")}
for region, pay in itertools.product(REGION, PAY):
    r0, r1, r2 = REGION[region]
    t0, t1, t2 = PAY[pay]
    fee = {("EU", "contract"): "included at no extra cost", ("EU", "prepaid"): "£2 a day",
           ("US", "contract"): "£5 a day", ("US", "prepaid"): "£7 a day",
           ("Asia", "contract"): "£8 a day", ("Asia", "prepaid"): "£10 a day"}[(region, pay)]
    doc("telecom", {"region": region, "pay": pay},
        f"Roaming charges, using your phone abroad in {r0}{f' ({r1})' if r1 != r0 else ''}: for {t0} customers "
        f"({t1}), roaming in {r1} is {fee}.", {"section": "roaming", "region": region, "payment": pay})
    forms = [f"roaming charges in {r0} on {t0}", f"how much does it cost to use my {t1} phone in {r1}",
             f"{t0} roaming fees {r2}", f"using mobile data in {r1} with a {t1} plan",
             f"is roaming in {r0} included for {t2} customers"]
    ask("telecom", {"region": region, "pay": pay}, pick(forms, 4), {"section": "roaming"})
for months in (12, 24):
    yw = {12: "one-year", 24: "two-year"}[months]
    doc("telecom", {"t": "termination", "months": months},
        f"Early termination fee, ending a {months}-month contract ({yw} contract) early: you pay "
        f"£{10 if months == 12 else 15} for each remaining month.", {"section": "contracts", "term": f"{months}m"})
    ask("telecom", {"t": "termination", "months": months},
        [f"early termination fee on a {months}-month contract", f"cancel my {months} month contract early cost",
         f"how much to leave a {yw} contract early", f"fee for breaking a {months}-month contract"],
        {"section": "contracts"})
for src, dst in (("UK", "US"), ("US", "UK")):
    rate = "5p a minute" if src == "UK" else "£1.20 a minute (roaming rate)"
    doc("telecom", {"t": "calls", "from": src, "to": dst},
        f"International calls, call rates from the {src} to the {dst} (calling the {dst} from the {src}): "
        f"{rate}.", {"section": "calls", "origin": src, "destination": dst})
    alias = {"US": "America", "UK": "the UK"}[dst]
    ask("telecom", {"t": "calls", "from": src, "to": dst},
        [f"cost of calling the {dst} from the {src}", f"price per minute for calls from the {src} to the {dst}",
         f"international call rates {src} to {dst}", f"how much to phone {alias} from the {src}"],
        {"section": "calls"})

# --- upgrades and wallet: direction pairs (issue 22). Each intent goes from one end to the other; its
# near miss is the same two ends swapped. Plans and billing periods, currencies by code and by name.
# The domain names sort after the others, so the split of the earlier domains stays the same.
SWITCH = [("monthly", "annual", "billing"), ("starter", "pro", "plan"), ("pro", "enterprise", "plan"),
          ("basic", "premium", "support plan"), ("weekly", "monthly", "payroll"), ("quarterly", "annual", "invoicing")]
for x, y, kind in SWITCH:
    for a, b in ((x, y), (y, x)):
        up = [x, y].index(b) == 1
        fact = ("takes effect at once; the unused part of the current period is credited to your account." if up
                else "takes effect at the end of the current term; unused time is not refunded.")
        doc("upgrades", {"ends": f"{x}/{y}", "dir": f"{a}>{b}"},
            f"Switching from {a} to {b} {kind} (moving {a} to {b}): the change {fact}",
            {"section": "changes", "change": f"{a}-to-{b}"})
        ask("upgrades", {"ends": f"{x}/{y}", "dir": f"{a}>{b}"}, pick([
            f"switch from {a} to {b} {kind}", f"changing my {kind} from {a} to {b}",
            f"what happens when I move from {a} to {b} {kind}", f"{a} to {b} {kind} change",
            f"how do I go from {a} to {b} {kind}"], 4))
CURRENCY = {"USD": "US dollars", "EUR": "euros", "GBP": "pounds", "JPY": "yen"}
for x, y in (("USD", "EUR"), ("EUR", "GBP"), ("USD", "JPY"), ("GBP", "USD"), ("EUR", "JPY")):
    for a, b in ((x, y), (y, x)):
        fee = 1.5 if "USD" in (a, b) else 1.0
        doc("wallet", {"ends": f"{x}/{y}", "dir": f"{a}>{b}"},
            f"Currency conversion from {a} to {b} ({CURRENCY[a]} into {CURRENCY[b]}): the fee is {fee + (0.5 if b == 'JPY' else 0)}"
            f"% of the amount and the {a}/{b} rate is fixed when you confirm.", {"section": "fx", "pair": f"{a}-{b}"})
        ask("wallet", {"ends": f"{x}/{y}", "dir": f"{a}>{b}"}, pick([
            f"fee to convert {a} to {b}", f"exchange {CURRENCY[a]} into {CURRENCY[b]}", f"{a} → {b} conversion fee",
            f"how much does it cost to change {a} to {b}", f"{a} to {b} exchange fee"], 4))


# --- issue 33: three product domains written as whole FAQ pages, with paraphrases of varied wording (few
# shared words) and near misses of the kinds an independent test found served: verbs and particles of
# opposite direction (import/export, into/out of, hand/take, give/take away, enable/disable, add/remove,
# grant/revoke, block/unblock, subscribe/unsubscribe, accept/decline, send/receive, upload/download),
# role swaps (who does what to whom), negation and entity swaps. Written for this issue, before any
# model was fitted; `files` is a tuning domain, `workspace` and `mailbox` are the second held-out split
# (bench/eval_cache.py SPLITS). No rng: every text is used.
FAQ: dict[str, list[tuple[str, str, list[str]]]] = {
    "files": [
        ("upload", "Uploading files: add files from your computer to the cloud drive with the Upload button or by "
         "dragging them into a folder.",
         ["how do I upload files to my drive", "put files from my computer onto the cloud drive",
          "drag files from my laptop into the drive", "add documents from my PC to cloud storage"]),
        ("download", "Downloading files: save files from the cloud drive to your computer with the Download button; "
         "folders download as a zip.",
         ["how do I download files from my drive", "get files off the cloud drive onto my computer",
          "save documents from cloud storage to my PC", "copy a folder from the drive down to my laptop"]),
        ("share", "Sharing a folder with someone: invite people by email and choose viewer or editor.",
         ["share a folder with a colleague", "give someone access to one of my folders",
          "invite a coworker to a folder", "let another person open my folder"]),
        ("shared-with-me", "Files shared with me: folders other people shared with you appear under Shared with me.",
         ["where are folders others shared with me", "find a folder a colleague shared with me",
          "open something a coworker gave me access to", "see files other people shared to me"]),
        ("trash-restore", "Restoring deleted files: files stay in the trash for 30 days; select them and click "
         "Restore to put them back.",
         ["recover a deleted file", "restore files from the trash", "get back a file I deleted by mistake",
          "undo deleting a document"]),
        ("trash-empty", "Emptying the trash: permanently delete files in the trash; they cannot be recovered.",
         ["permanently delete files in the trash", "empty the trash for good", "erase deleted files forever",
          "clear out the trash bin"]),
        ("sync-on", "Turning on sync for a folder: enable sync so the folder is kept on this computer and updated "
         "automatically.",
         ["turn on sync for a folder", "enable folder syncing on my computer", "keep a folder synced to this laptop",
          "start syncing a folder locally"]),
        ("sync-off", "Turning off sync for a folder: disable sync to stop keeping the folder on this computer.",
         ["turn off sync for a folder", "disable folder syncing on my computer", "stop a folder from syncing to this laptop",
          "pause syncing a folder locally"]),
        ("storage", "Storage quota: how much space you have and what uses it; buy more storage in settings.",
         ["how much storage space do I have", "check my storage quota", "what is using up my drive space",
          "see remaining space on the drive"]),
        ("versions", "Version history: open an earlier version of a file and restore it.",
         ["see older versions of a file", "file version history", "go back to a previous version of a document",
          "restore an earlier version of my file"]),
        ("link-public", "Public links: create a link anyone can open without signing in.",
         ["create a public link to a file", "make a link anyone can open", "share a file with people without an account",
          "get a shareable link for a document"]),
        ("link-no-public", "Links without public access: restrict a link so only people in your organization can "
         "open it; nobody outside can use it.",
         ["make a link that is not public", "restrict a link so outsiders can't open it",
          "share a link only inside my organization", "link that nobody outside the company can open"]),
    ],
    "workspace": [
        ("csv-import", "Importing a CSV file into a board: each row becomes a card; map columns to card fields.",
         ["How do I get a CSV file into Boards?", "import a CSV into a board", "upload a spreadsheet of tasks into my board",
          "bring CSV data into Boards", "create cards on a board from a CSV import"]),
        ("csv-export", "Exporting a board as a CSV file: download every card of a board as rows of a spreadsheet.",
         ["How do I get my board out as a CSV file?", "export a board to CSV", "download my board as a spreadsheet",
          "save a board's cards out to a CSV file"]),
        ("owner-hands", "Transferring ownership: the current owner hands the workspace over to an admin in "
         "Settings > Members > Make owner.",
         ["How does the owner hand ownership to an admin?", "owner transferring workspace ownership to an admin",
          "as the owner, make an admin the new owner", "owner gives the workspace to one of the admins"]),
        ("admin-takes", "Claiming ownership: when the owner has left the company, an admin can take ownership "
         "after support verifies the domain.",
         ["How does an admin take ownership from an owner who left?", "admin claiming ownership after the owner left the company",
          "take over a workspace whose owner is gone", "as an admin, get ownership back from an owner who quit"]),
        ("2fa-on", "Enabling two-factor authentication: turn on 2FA in Security and scan the QR code.",
         ["how do I enable two-factor authentication", "turn on two-factor authentication for my account",
          "activate two-factor login", "switch on two-factor sign-in"]),
        ("2fa-off", "Disabling two-factor authentication: turn off 2FA in Security; you need a backup code.",
         ["how do I disable two-factor authentication", "turn off two-factor authentication for my account",
          "deactivate two-factor login", "switch off two-factor sign-in"]),
        ("guest-grant", "Giving a guest access to a board: invite an external guest as viewer or editor.",
         ["grant a guest access to a board", "give a guest permission on a board", "let an outside guest into my board",
          "invite an external guest to a board"]),
        ("guest-revoke", "Revoking a guest's access: remove an external guest from a board; their link stops working.",
         ["revoke a guest's access to a board", "take away a guest's permission on a board",
          "remove an outside guest from my board", "kick an external guest off a board"]),
        ("member-add", "Adding members to a team: invite teammates by email; they join as members.",
         ["add a member to a team", "put a new person on my team", "invite a teammate to join the team",
          "how do I add people to a team"]),
        ("member-remove", "Removing members from a team: remove a teammate; their cards stay on the boards.",
         ["remove a member from a team", "take a person off my team", "kick a teammate out of the team",
          "how do I remove people from a team"]),
        ("archive", "Archiving a board: archived boards are hidden from the sidebar and become read-only.",
         ["archive a board", "put an old board into the archive", "hide a finished board by archiving it",
          "how to archive boards I no longer use"]),
        ("unarchive", "Restoring an archived board: open the archive and unarchive the board to edit it again.",
         ["unarchive a board", "get a board back out of the archive", "bring an archived board back",
          "restore a board from the archive"]),
        ("background", "Board backgrounds: pick a colour, a photo or upload your own background image.",
         ["change the background colour of a board", "set a custom board background", "pick a different background for my board",
          "board background settings"]),
        ("shortcuts", "Keyboard shortcuts: press ? to list every shortcut.",
         ["keyboard shortcuts in Boards", "list of hotkeys", "what shortcuts can I use on the keyboard",
          "shortcut keys for boards"]),
        ("due-reminder", "Due date reminders: get a notification a day before a card is due.",
         ["set a due date reminder on a card", "get notified before a card is due", "reminder ahead of a card's due date",
          "due date notifications for cards"]),
        ("mentions", "Mentions: type @ and a name in a card comment to notify a teammate.",
         ["mention someone in a card comment", "tag a teammate in a comment", "@mention a person on a card",
          "how do mentions in comments work"]),
        ("due-none", "Filtering cards without a due date: the filter 'No due date' shows cards that have none.",
         ["filter cards that have no due date", "show cards without a due date", "find cards missing a due date",
          "which cards don't have a due date"]),
        ("due-some", "Filtering cards that have a due date: the filter 'Has due date' shows only dated cards.",
         ["filter cards that have a due date", "show cards with a due date", "find cards that have due dates set",
          "which cards have a due date"]),
        ("slack", "Slack integration: post board activity to a Slack channel.",
         ["connect Boards to Slack", "Slack integration for Boards", "send board updates to Slack",
          "set up the Slack integration"]),
        ("jira", "Jira integration: link cards to Jira issues and sync their status.",
         ["connect Boards to Jira", "Jira integration for Boards", "sync board cards with Jira",
          "set up the Jira integration"]),
    ],
    "mailbox": [
        ("block", "Blocking a sender: messages from a blocked address go straight to trash.",
         ["block a sender", "stop emails from a specific address", "blacklist an email address",
          "prevent someone from emailing me"]),
        ("unblock", "Unblocking a sender: take an address off your blocked senders list so its mail arrives again.",
         ["unblock a sender", "allow emails from an address I blocked", "take an address off my blocked senders list",
          "let a blocked sender email me again"]),
        ("unsubscribe", "Unsubscribing from mailing lists: click Unsubscribe at the top of a newsletter.",
         ["unsubscribe from a mailing list", "stop getting newsletter emails", "opt out of marketing emails",
          "get off a mailing list"]),
        ("subscribe", "Subscribing to mailing lists: sign up to newsletters from the sender's page.",
         ["subscribe to a mailing list", "sign up for a newsletter", "opt in to marketing emails", "join a mailing list"]),
        ("contacts-import", "Importing contacts from a CSV file into your address book.",
         ["import contacts from a CSV file", "load my contacts in from a spreadsheet",
          "bring contacts into the address book from a CSV", "upload a contacts CSV"]),
        ("contacts-export", "Exporting contacts to a CSV file from your address book.",
         ["export contacts to a CSV file", "save my contacts out to a spreadsheet",
          "get my address book out as a CSV", "download my contacts as a CSV"]),
        ("cal-share", "Sharing your calendar with a coworker: choose who can see your calendar and how much.",
         ["share my calendar with a coworker", "give a colleague access to my calendar", "let a coworker see my calendar",
          "make my calendar visible to a teammate"]),
        ("cal-open", "Opening a coworker's calendar: add a calendar someone shared with you to your list.",
         ["see a coworker's calendar", "view a colleague's shared calendar", "open a calendar someone shared with me",
          "add a teammate's calendar to my list"]),
        ("delegate-me", "Sending on behalf of someone: a delegate sends email on behalf of the mailbox owner.",
         ["send email on behalf of my manager", "send messages as a delegate for my boss",
          "email people on my manager's behalf", "act as a delegate sending mail for someone else"]),
        ("delegate-them", "Adding a delegate: let an assistant send email on your behalf.",
         ["let my assistant send email on my behalf", "allow someone to send messages for me",
          "give my assistant delegate access to my mailbox", "make a coworker my email delegate"]),
        ("receive", "Not receiving email: incoming messages are not arriving; check filters and storage.",
         ["I can't receive emails", "not getting incoming mail", "incoming emails are not arriving",
          "messages sent to me never show up"]),
        ("send", "Not sending email: outgoing messages are stuck in the outbox; check the SMTP settings.",
         ["I can't send emails", "outgoing mail is stuck", "my emails don't go out", "messages I write never get sent"]),
        ("invite-accept", "Accepting a meeting invitation: click Yes in the invite; the event is added to your calendar.",
         ["accept a meeting invite", "say yes to a meeting invitation", "RSVP yes to an event", "confirm I'll attend a meeting"]),
        ("invite-decline", "Declining a meeting invitation: click No and add an optional note to the organizer.",
         ["decline a meeting invite", "say no to a meeting invitation", "RSVP no to an event", "reject a meeting request"]),
        ("schedule", "Scheduling an email: choose Send later and a date and time.",
         ["schedule an email to send later", "send an email at a set time", "delay sending a message until tomorrow morning",
          "write an email now and send it later"]),
        ("signature", "Email signature: edit your signature in Settings > Compose.",
         ["change my email signature", "edit the signature at the bottom of my emails", "add a signature to outgoing mail",
          "update my email sign-off"]),
        ("ooo", "Out-of-office reply: set an automatic reply while you are away.",
         ["set an out of office reply", "automatic reply while I'm on vacation", "turn on an away message",
          "auto-respond to emails while away"]),
        ("iphone", "Setting up mail on an iPhone: add the account in iOS Settings > Mail.",
         ["set up my email on an iPhone", "add my mailbox to iPhone mail", "configure email on iOS",
          "read my work email on an iPhone"]),
        ("android", "Setting up mail on an Android phone: add the account in the Gmail app.",
         ["set up my email on an Android phone", "add my mailbox to Android mail", "configure email on Android",
          "read my work email on an Android phone"]),
        ("recall", "Recalling a message: undo send within 30 seconds of sending.",
         ["recall a sent email", "unsend a message I just sent", "undo sending an email", "take back an email after sending it"]),
    ],
}
for domain, pages in FAQ.items():
    for intent, text, texts in pages:
        doc(domain, {"faq": intent}, text, {"page": intent})
        ask(domain, {"faq": intent}, texts)

new_texts = [q["text"] for q in queries[OLD_QUERIES:]]
assert len(set(new_texts)) == len(new_texts), "a query text of the later domains is repeated"
assert not set(new_texts) & {q["text"] for q in queries[:OLD_QUERIES]}, "a later query repeats an earlier one"

OUT.write_text(json.dumps({"docs": docs, "queries": queries}, indent=1) + "\n")
print(f"{len(docs)} docs, {len(queries)} queries -> {OUT}")
