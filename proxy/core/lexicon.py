"""Word lists the verifier reads: stopwords, numbers, units, dates, negation, directions, synonyms, names.

Pure data. Canonical forms make paraphrases agree ("yearly" = "annual", "EU" = "europe") while
different values stay different ("annual" != "monthly", "increase" != "decrease").
"""

from __future__ import annotations


def _spread(groups: dict[str, str]) -> dict[str, str]:
    """{"a b c": canon} -> {"a": canon, "b": canon, "c": canon}."""
    return {w: canon for words, canon in groups.items() for w in words.split()}


STOPWORDS = frozenset(["a", "an", "the", "of", "for", "in", "on", "at", "by", "with", "about", "as", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "doing", "done", "i", "me", "my", "we", "our", "you", "your", "he", "she", "it", "its", "they", "them", "their", "this", "that", "these", "those", "there", "here", "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "can", "could", "should", "would", "will", "shall", "may", "might", "must", "have", "has", "had", "having", "get", "gets", "got", "and", "or", "but", "if", "then", "so", "than", "too", "very", "just", "also", "any", "some", "all", "each", "every", "both", "either", "such", "own", "same", "other", "into", "onto", "over", "under", "up", "down", "out", "off", "again", "further", "once", "per", "via", "vs", "versus", "please", "tell", "show", "explain", "give", "find", "need", "want", "know", "like", "let", "make", "much", "many", "more", "most", "less", "least", "few", "one's", "s", "t", "policy", "policies", "info", "information", "details", "detail", "rule", "rules", "way", "ways", "work", "works", "question"]) - {"more", "most", "less", "least", "up", "down", "over", "under", "before", "after", "than", "out",
                "in", "into", "off", "on"}

NEGATIONS = frozenset(["not", "no", "never", "without", "none", "neither", "nor", "cannot", "can't", "cant", "won't", "dont", "don't", "doesn't", "isn't", "aren't", "wasn't", "weren't", "excluding", "except", "unless", "non"])

# Words that open a slot: the next content word is the source, the target or the comparand.
ROLE_MARKERS = {"from": "from", "to": "to", "into": "to", "onto": "to", "towards": "to", "toward": "to", "than": "than",
                "vs": "vs", "versus": "vs", "against": "vs"}

NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000", "dozen": "12",
    "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th", "half": "0.5",
    "single": "1", "double": "2x", "twice": "2x", "triple": "3x",
}
ORDINAL_SUFFIXES = frozenset({"st", "nd", "rd", "th"})

UNITS = _spread({
    "kg kgs kilogram kilo kilos": "kg", "g gram grams gr": "g", "lb lbs pound pounds": "lb", "oz ounce": "oz",
    "km kilometer kilometre kms": "km", "mi mile miles": "mile", "m meter metre meters": "m",
    "cm centimeter centimetre": "cm", "mm millimeter": "mm", "ft foot feet": "ft", "inch inches in.": "inch",
    "gb gigabyte gigabytes gig gigs": "gb", "mb megabyte megabytes": "mb", "tb terabyte terabytes": "tb",
    "kb kilobyte kilobytes": "kb", "ms millisecond milliseconds": "ms", "sec secs seconds second_": "second",
    "min mins minute minutes": "minute", "h hr hrs hour hours": "hour", "day days": "day",
    "week weeks wk": "week", "month months mo": "month", "year years yr yrs": "year",
    "usd dollar dollars bucks": "usd", "eur euro euros": "eur", "gbp sterling": "gbp",
    "percent percentage pct": "percent", "mg milligram milligrams": "mg", "ml milliliter millilitre": "ml",
    "l liter litre liters litres": "l", "ghz": "ghz", "mhz": "mhz", "mbps": "mbps", "gbps": "gbps",
    "w watt watts": "w", "kw kilowatt": "kw", "kwh": "kwh", "v volt volts": "v", "mah": "mah",
    "seat seats": "seat", "user users": "user", "celsius": "celsius", "fahrenheit": "fahrenheit",
})
SYMBOL_UNITS = {"$": "usd", "€": "eur", "£": "gbp", "%": "percent"}

# Time periods and dates; "annual" and "yearly" share a canonical form, "annual" and "monthly" do not.
DATES = {
    **_spread({
        "annual annually yearly year-long 12-month twelve-month": "period:year",
        "monthly month-to-month": "period:month", "weekly": "period:week", "daily everyday": "period:day",
        "quarterly": "period:quarter", "quarter quarters": "quarter", "hourly": "period:hour", "biweekly fortnightly": "period:2week",
        "semiannual semi-annual biannual": "period:halfyear", "lifetime perpetual": "period:lifetime",
        "today tonight": "day:0", "yesterday": "day:-1", "tomorrow": "day:+1",
        "weekend weekends": "weekend", "weekday weekdays business-day": "weekday",
        "morning mornings": "morning", "afternoon": "afternoon", "evening evenings": "evening",
        "night nights overnight": "night",
        "q1": "q1", "q2": "q2", "q3": "q3", "q4": "q4",
        "h1": "h1", "h2": "h2",
        "spring": "spring", "summer": "summer", "autumn fall": "autumn", "winter": "winter",
        "holiday holidays": "holiday",
    }),
    **{m: f"month:{i}" for i, names in enumerate(
        ["january jan", "february feb", "march mar", "april apr", "may_", "june jun", "july jul",
         "august aug", "september sep sept", "october oct", "november nov", "december dec"], start=1)
       for m in names.split()},
    **{d: f"dow:{i}" for i, names in enumerate(
        ["monday mon", "tuesday tue tues", "wednesday wed", "thursday thu thurs", "friday fri",
         "saturday sat", "sunday sun"]) for d in names.split()},
}
DATE_QUALIFIERS = {"last": "prev", "previous": "prev", "past": "prev", "next": "next", "coming": "next",
                   "this": "cur", "current": "cur", "upcoming": "next", "prior": "prev"}

# Direction and comparison: each word maps to one pole; opposite poles never agree.
DIRECTIONS = _spread({
    "increase increases increased increasing raise raised raising grow growth rise rising gain gains": "up",
    "decrease decreases decreased decreasing reduce reduced reduction lower lowered cut cuts drop decline fall": "down",
    "upgrade upgrading upgraded": "upgrade", "downgrade downgrading downgraded": "downgrade",
    "above over exceed exceeding exceeds beyond greater higher more larger bigger max maximum most": "more",
    "below under beneath less lower fewer smaller min minimum least": "less",
    "before prior earlier preceding": "before", "after following later subsequent": "after",
    "buy buying bought purchase purchasing": "buy", "sell selling sold": "sell",
    "import imports importing imported": "import", "export exports exporting exported": "export",
    "upload uploads uploading": "upload", "download downloads downloading": "download",
    "approve approved approval approving accept accepted grant granted allow allowed permit": "approve",
    "deny denied denial denying reject rejected rejection refuse refused decline declined block blocked": "deny",
    "revoke revokes revoked revoking revocation": "deny",
    "enable enabled enabling activate activated turn-on": "enable",
    "disable disabled disabling deactivate deactivated turn-off": "disable",
    "add adding added create creating": "add", "remove removing removed delete deleting deleted": "remove",
    "inbound incoming": "inbound", "outbound outgoing": "outbound",
    "oldest earliest": "oldest", "newest latest recent": "newest",
    "cheapest cheaper": "cheap", "expensive pricier costlier": "expensive",
    "fastest faster quicker quickest": "fast", "slowest slower": "slow",
    "best": "best", "worst": "worst", "start starting begin beginning open opening": "start",
    "end ending finish close closing": "end", "join joining onboard onboarding": "join",
    "leaving offboard offboarding quit resign resigning": "leave",
    "deposit deposits depositing": "deposit", "withdraw withdrawal withdrawing withdrawals": "withdraw",
    "send sending sent": "send", "receive receiving received": "receive",
    "encrypt encryption encrypting": "encrypt", "decrypt decryption decrypting": "decrypt",
    # uninstalling software is removing it: "remove the agent" is "uninstall the agent", never "install" it
    "install installing installation": "install", "uninstall uninstalling uninstallation": "remove",
    "north northern": "north", "south southern": "south", "east eastern": "east", "west western": "west",
    "domestic": "domestic", "international abroad overseas": "international",
    "adult adults": "adult", "child children kid kids minor minors infant": "child",
    "senior seniors": "senior", "student students": "student",
    "full-time fulltime": "fulltime", "part-time parttime": "parttime",
    "contractor contractors freelancer": "contractor", "employee employees staff": "employee",
    "personal": "personal", "business corporate": "business",
    "new": "new", "existing current": "existing", "used": "used", "refurbished": "refurbished",
})
DIRECTIONS.pop("", None)

# Direction by meaning (issue 33): verbs and particles that say which way something moves, read as
# opposites. Unlike DIRECTIONS (which must be equal), a motion refuses only against its opposite:
# "hand ownership to an admin" never serves "take ownership from an owner", "get a CSV into Boards"
# never "get my board out as a CSV", "unsubscribe" never "subscribe"; a word on one side only is left
# to the rest of verification.
MOTIONS = _spread({
    "give gives giving gave given hand hands handing handed lend lends lending lent": "give",
    "take takes taking took taken claim claims claiming claimed reclaim reclaiming borrow borrows borrowing borrowed": "take",
    "into onto": "in", "out off": "out",
    "enter enters entering entered": "enter", "exit exits exiting exited": "exit",
    "arrive arrives arriving arrival arrivals": "arrive", "depart departs departing departure departures": "depart",
    "push pushes pushing pushed": "push", "pull pulls pulling pulled": "pull",
    "attach attaches attaching attached": "attach", "detach detaches detaching detached": "detach",
    "fire fires firing fired dismiss dismissing dismissed": "fire", "hire hires hiring hired recruit recruiting": "hire",
    "promote promotes promoting promoted promotion": "promote", "demote demotes demoting demoted demotion": "demote",
    "merge merges merging merged": "merge", "split splits splitting": "split",
    "expand expands expanding expanded": "expand", "collapse collapses collapsing collapsed": "collapse",
    "show shows showing shown unhide unhides unhiding": "show", "hide hides hiding hid hidden": "hide",
    "maximize maximise maximizing": "maximize", "minimize minimise minimizing": "minimize",
    "lock locks locking locked": "lock", "unlock unlocks unlocking unlocked": "unlock",
})
OPPOSITE_MOTIONS = {a: b for x, y in (("give", "take"), ("in", "out"), ("enter", "exit"), ("arrive", "depart"),
                                      ("push", "pull"), ("attach", "detach"), ("hire", "fire"),
                                      ("promote", "demote"), ("merge", "split"), ("expand", "collapse"),
                                      ("show", "hide"), ("maximize", "minimize"), ("lock", "unlock"))
                    for a, b in ((x, y), (y, x))}
# What a question asks for (issue 33): "how long does express shipping take" is not "how much is express
# shipping", whatever their words share. A query with no such word asks for nothing in particular.
QUESTION_FOCUS = {"how long": "time", "how soon": "time", "when": "time", "how much": "quantity",
                  "how many": "quantity", "how often": "frequency", "how far": "distance", "how old": "age",
                  "where": "place", "who": "person", "whom": "person", "why": "reason"}
# Content words that name what is asked for without a question word (canonical forms): "Japan express
# shipping cost" asks how much, "transit time to Japan" how long. They only add a focus, so they can
# only refuse more: a query asking for a time is never served a price.
FOCUS_WORDS = {"price": "quantity", "time": "time", "duration": "time"}

# Verbs a prefix reverses: "unsubscribe", "unarchive", "disconnect", "deselect" are the opposite of the
# bare verb (motion "v:subscribe" against "un:subscribe").
REVERSIBLE = frozenset(["block", "subscribe", "archive", "share", "pin", "follow", "mute", "link", "assign",
                        "publish", "mount", "pack", "zip", "freeze", "suspend", "select", "tag", "star", "flag",
                        "watch", "connect", "allow", "approve", "register", "enroll", "enrol", "list", "friend",
                        "verify", "load", "mark", "check", "delete", "sync", "install", "favorite", "favourite",
                        "bookmark", "group", "authorize", "authorise", "trust", "hide"])
REVERSING_PREFIXES = ("un", "dis", "de")
# A particle after one of these verbs says which way: "log in" / "log out", "opt in" / "opt out",
# "put someone on the team" / "take someone off it"; "turn on" / "switch off" enable and disable.
PHRASAL_VERBS = frozenset(["log", "logged", "logging", "sign", "signed", "signing", "opt", "opted", "opting",
                           "check", "checked", "checking", "plug", "plugged", "let", "bring", "brought", "put",
                           "move", "moved", "moving", "clock", "clocked", "punch", "dial", "zoom", "cash",
                           "hand", "turn", "turned", "switch", "switched", "kick", "kicked", "carry", "roll"])
SWITCH_VERBS = frozenset(["turn", "turned", "turning", "switch", "switched", "switching", "toggle"])

# Paraphrase-neutral synonyms: different words, same retrieval intent.
SYNONYMS = _spread({
    "plan plans subscription subscriptions tier tiers package packages membership": "plan",
    "window period timeframe time-frame deadline limit": "window",
    "refund refunds refunded reimbursement reimburse money-back repayment": "refund",
    "cancel cancels cancelled canceled cancelling canceling cancellation terminate termination": "cancel",
    "cost costs price prices pricing charge charges fee fees rate rates": "price",
    "account accounts profile": "account", "password passwords passcode": "password",
    "reset resetting recover recovery": "reset", "change changing modify update updating edit switch switching switched": "change",
    "customer customers client clients": "customer", "car cars vehicle vehicles auto": "car",
    "phone phones smartphone smartphones handset mobile": "phone", "laptop laptops notebook notebooks": "laptop",
    "flight flights plane airfare": "flight", "bag bags baggage luggage suitcase": "baggage",
    "ticket tickets fare fares": "ticket", "hotel hotels accommodation lodging": "hotel",
    "leave pto vacation time-off": "pto", "salary salaries pay wage wages compensation": "salary",
    "doctor doctors physician": "doctor", "medicine medication medications drug drugs": "medication",
    "dose dosage doses": "dose", "allowed permitted allowance": "allowance",
    "shipping delivery deliveries ship shipped": "shipping", "return returns returning": "return",
    "warranty warranties guarantee": "warranty", "setup set-up configure configuration configuring": "setup",
    "error errors issue issues problem problems bug bugs": "error", "fix fixing resolve solve troubleshoot": "fix",
    "big large huge": "large", "small tiny little": "small", "long lengthy": "long", "quick fast rapid": "fast",
    "buy purchase": "buy", "begin start": "start", "obtain get acquire": "get",
    "eu europe european": "europe", "us usa u.s. america american united-states": "us",
    "uk britain british": "uk", "apac asia asian asia-pacific": "apac", "canada canadian": "canada",
    "germany german": "germany", "france french": "france", "japan japanese": "japan",
    "india indian": "india", "australia australian": "australia", "latam": "latam",
    "linux": "linux", "windows": "windows", "mac macos osx": "macos",
    "enterprise": "enterprise", "pro professional": "pro", "premium": "premium", "basic": "basic",
    "free": "free", "starter": "starter", "team teams": "team",
    "checking current-account": "checking", "savings saving": "savings",
    "transfer transfers transferring wire wires": "transfer", "loan loans mortgage mortgages": "loan",
    "interest": "interest", "card cards": "card", "credit": "credit", "debit": "debit",
    "employer company organisation organization": "company", "employ hire hiring": "hire",
    "rule-of-thumb guideline guidelines": "guideline", "requirement requirements required require": "require",
    "allow allows allowed": "allow",
    "eligible eligibility qualify qualifies": "eligible", "apply application applying": "apply",
    "explain describe": "explain", "document documents doc docs documentation": "doc",
})

# Names that act as filters wherever they occur: regions, plan types, platforms, products, currencies.
GAZETTEER = frozenset(["europe", "us", "uk", "apac", "canada", "germany", "france", "japan", "india", "australia", "latam", "mexico", "brazil", "china", "spain", "italy", "ireland", "netherlands", "singapore", "korea", "africa", "emea", "nordics", "switzerland", "sweden", "norway", "denmark", "poland", "london", "paris", "berlin", "tokyo", "new-york", "york", "sydney", "madrid", "rome", "amsterdam", "dublin", "toronto", "chicago", "boston", "seattle", "enterprise", "pro", "premium", "basic", "free", "starter", "team", "business", "personal", "family", "student", "linux", "windows", "macos", "android", "ios", "ubuntu", "debian", "centos", "rhel", "docker", "kubernetes", "aws", "azure", "gcp", "visa", "mastercard", "amex", "paypal", "stripe", "checking", "savings", "credit", "debit"])

PERIOD_UNITS = {"hour": "period:hour", "day": "period:day", "week": "period:week", "month": "period:month",
                "year": "period:year"}
# Period units a query may name without stating one ("how many days", "hours flying"): without a number
# they are what is asked for, not a facet of the answer (a stated "30 days" still must agree).
BARE_PERIODS = frozenset(["minute", "hour", "day", "week", "month", "year"])

# Canonical forms of common words: capitalised ("PTO", "Refund") they are still not names.
SYNONYM_TARGETS = frozenset(SYNONYMS.values()) - GAZETTEER

# possessives of the asker: "my", "our" and the help desk's "your" name the same owner
SELF_POSSESSIVES = frozenset(["my", "our", "your", "mine", "ours", "yours"])
