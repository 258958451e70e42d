"""Writes corpus.jsonl, workload.jsonl and gold.jsonl next to this file (the data files are what ships).

Deterministic (seeded). Run `python proxy/tools/demo/data/generate.py` after editing facts or questions.
Gold answers go to their own file: the agent and the scripted LLM never read it.
"""
import json
import pathlib
import random

HERE = pathlib.Path(__file__).parent
rnd = random.Random(7)
chunks = []
def add(doc, n, text, groups, title):
    chunks.append({"id": f"{doc}#{n}", "doc": doc, "title": title, "text": text, "groups": groups})

services = [
 ("Ledger", "processes refunds", "Payments Platform", "Priya Raman", "99.95", "eu-west-1 and us-east-2", "2026-03-14", 47),
 ("Vault", "stores invoices", "Payments Platform", "Tomas Berg", "99.9", "eu-central-1", "2026-05-02", 22),
 ("Beacon", "sends customer notifications", "Messaging", "Aiko Tanaka", "99.5", "us-west-2", "2026-01-19", 95),
 ("Atlas", "hosts the customer map tiles", "Geo", "Marco Ricci", "99.9", "eu-west-1", "2026-07-08", 31),
 ("Harbor", "builds container images", "Developer Tools", "Lena Vogel", "99.0", "us-east-1", "2026-02-27", 180),
 ("Quill", "renders PDF statements", "Documents", "Samir Haddad", "99.5", "ap-southeast-2", "2026-06-11", 64),
 ("Relay", "routes webhook deliveries", "Messaging", "Chen Wei", "99.95", "us-east-2 and eu-west-1", "2026-08-21", 12),
 ("Sentinel", "scans uploads for malware", "Security Engineering", "Noor Aziz", "99.9", "eu-north-1", "2026-04-05", 53),
 ("Orbit", "schedules batch exports", "Data Platform", "Jonas Lind", "99.0", "us-central-1", "2026-09-30", 240),
 ("Prism", "computes usage analytics", "Data Platform", "Fatima Zahra", "99.5", "eu-west-3", "2026-10-17", 75),
 ("Cobalt", "issues API keys", "Security Engineering", "Oskar Nyberg", "99.99", "us-east-1 and eu-central-1", "2026-02-09", 8),
 ("Juniper", "manages customer sessions", "Identity", "Grace Okafor", "99.99", "eu-west-1", "2026-11-02", 15),
]
teams = {"Payments Platform": ("Dana Ortiz", "Tuesday", "#pay-platform"), "Messaging": ("Ivan Petrov", "Monday", "#messaging"),
 "Geo": ("Mei Lin", "Thursday", "#geo"), "Developer Tools": ("Rafael Gomez", "Wednesday", "#devtools"),
 "Documents": ("Hannah Weiss", "Friday", "#docs-team"), "Security Engineering": ("Kwame Mensah", "Monday", "#sec-eng"),
 "Data Platform": ("Elif Kaya", "Wednesday", "#data-platform"), "Identity": ("Lucas Moreau", "Thursday", "#identity")}
for name, fn, team, contact, sla, regions, inc_date, inc_min in services:
    doc = f"service-{name.lower()}"; t = f"{name} service"
    add(doc, 1, f"{name} is the service that {fn}. It is part of the Northwind Cloud platform.", ["public"], t)
    add(doc, 2, f"{name} is owned by the {team} team. Questions about {name} go to the owning team first.", ["public"], t)
    add(doc, 3, f"The uptime target for {name} is {sla} percent, measured monthly.", ["public"], t)
    add(doc, 4, f"{name} runs in the {regions} regions.", ["public"], t)
    add(doc, 5, f"The escalation contact for {name} is {contact}. Page them only for customer-facing outages.", ["staff"], t + " (internal)")
    add(doc, 6, f"To restart {name}, drain traffic with nwctl drain {name.lower()}, wait until the queue depth reaches zero, then run nwctl restart {name.lower()}.", ["staff"], t + " runbook")
    add(doc, 7, f"The last major incident on {name} was on {inc_date} and lasted {inc_min} minutes.", ["staff"], t + " incidents")
    add(doc, 8, f"To rotate the credentials of {name}, open the secrets console, select {name.lower()}-prod and click Rotate now.", ["staff"], t + " runbook")
for team, (lead, day, chan) in teams.items():
    doc = "team-" + team.lower().replace(" ", "-")
    add(doc, 1, f"The {team} team is led by {lead}.", ["public"], f"{team} team")
    add(doc, 2, f"The {team} team holds its planning meeting every {day}.", ["staff"], f"{team} team")
    add(doc, 3, f"The chat channel of the {team} team is {chan}.", ["staff"], f"{team} team")
billing = [
 "The refund window for annual plans is 30 days from the renewal date.",
 "The refund window for monthly plans is 7 days from the charge date.",
 "Annual plans are billed once a year and include a 15 percent discount over monthly billing.",
 "Monthly plans are billed on the first day of each month.",
 "To request a refund, open the billing portal, choose the invoice and click Request refund.",
 "Invoices are issued in euros for customers in the EU and in US dollars elsewhere.",
 "The late payment fee is 2 percent of the outstanding amount per month.",
 "Enterprise plans include a dedicated account manager and a 99.99 percent uptime commitment.",
 "To change the billing address, open Settings, then Billing, and edit the address of the account.",
 "Payment by bank transfer is available for annual plans only.",
 "The free trial lasts 14 days and does not require a credit card.",
 "Customers in Canada are charged sales tax according to their province.",
 "To cancel a subscription, open the billing portal and click Cancel plan; access continues until the end of the period.",
 "Credits from service outages are applied to the next invoice automatically.",
 "Discount codes cannot be combined with the annual plan discount.",
 "Usage above the plan quota is billed at 0.02 dollars per API call.",
]
for i, t in enumerate(billing, 1): add("billing-policy", i, t, ["public"], "Billing policy")
security = [
 ("Passwords must be rotated every 90 days for all staff accounts.", ["staff"]),
 ("Multi-factor authentication is required for every admin account.", ["public"]),
 ("API keys expire after 180 days and must be reissued through Cobalt.", ["public"]),
 ("Customer data is encrypted at rest with AES-256.", ["public"]),
 ("Security incidents must be reported to the security desk within 1 hour.", ["staff"]),
 ("Laptops must use full-disk encryption and lock after 5 minutes of inactivity.", ["staff"]),
 ("Penetration tests are run by an external firm twice a year.", ["public"]),
 ("To report a vulnerability, email security@northwind.example with the steps to reproduce.", ["public"]),
 ("Production database access requires an approved ticket and expires after 8 hours.", ["staff"]),
 ("Audit logs are retained for 400 days.", ["public"]),
 ("Session tokens issued by Juniper expire after 12 hours of inactivity.", ["public"]),
 ("Staff must complete security training within 30 days of joining.", ["staff"]),
]
for i, (t, g) in enumerate(security, 1): add("security-policy", i, t, g, "Security policy")
hr = [
 "Employees accrue 2 days of paid leave per month.",
 "Parental leave is 16 weeks at full pay.",
 "The expense limit for team dinners is 60 euros per person.",
 "Remote work is allowed up to 3 days per week.",
 "To submit an expense, photograph the receipt in the expenses app and submit it within 30 days.",
 "The annual performance review takes place in November.",
 "New laptops are refreshed every 3 years.",
 "The learning budget is 1500 euros per employee per year.",
 "To book a meeting room, use the rooms tab in the calendar app.",
 "The office in Lisbon is open from 8 am to 8 pm on weekdays.",
]
for i, t in enumerate(hr, 1): add("handbook", i, t, ["staff"], "Employee handbook")
# distractor release notes: same vocabulary, never the answer
things = ["retry handling", "dashboard load time", "log formatting", "memory use", "startup time", "error messages",
          "metrics labels", "connection pooling", "TLS configuration", "rate limiting", "cache warm-up", "pagination"]
for name, *_ in services:
    for v in range(1, 10):
        th = rnd.choice(things); th2 = rnd.choice(things)
        add(f"release-notes-{name.lower()}", v, f"Release 4.{v} of {name} improved {th} and fixed a bug in {th2}.", ["public"], f"{name} release notes")
for v in range(1, 31):
    th = rnd.choice(things)
    add("platform-changelog", v, f"Platform change {v}: the shared gateway now has better {th}; no customer action is needed.", ["public"], "Platform changelog")
for n in range(1, 41):
    add("finance-archive", n, f"Finance archive part {n}: the revenue of Northwind for earlier years is summarised in finance archive part {n + 1}.", ["public"], "Finance archive")
print(len(chunks))
with open(str(HERE / "corpus.jsonl"), "w") as f:
    f.writelines(json.dumps(c) + "\n" for c in chunks)

# workload: (kind, principal, question, gold). gold None = the right answer is "not found"
W = []
def q(kind, who, text, gold): W.append({"kind": kind, "principal": who, "question": text, "gold": gold})
q("simple_fact", "bob", "What is the refund window for annual plans?", "30 days")
q("simple_fact", "bob", "What is the refund window for monthly plans?", "7 days")
q("simple_fact", "alice", "What is the uptime target for Relay?", "99.95 percent")
q("procedural", "alice", "How do I restart Ledger?", "nwctl restart ledger")
q("multi_hop", "alice", "Which service processes refunds, and who is its escalation contact?", "Priya Raman")
q("access", "alice", "Who is the escalation contact for Vault?", "Tomas Berg")
q("access", "bob", "Who is the escalation contact for Vault?", None)
q("runaway", "alice", "Investigate how the revenue of Northwind developed before 1990.", None)
QUICK = len(W)
q("simple_fact", "bob", "How long is the free trial?", "14 days")
q("simple_fact", "alice", "How often must passwords be rotated?", "90 days")
q("simple_fact", "bob", "When do API keys expire?", "180 days")
q("simple_fact", "alice", "How many weeks is parental leave?", "16 weeks")
q("simple_fact", "bob", "What is the late payment fee?", "2 percent")
q("simple_fact", "bob", "Which regions does Beacon run in?", "us-west-2")
q("simple_fact", "alice", "How long are audit logs retained?", "400 days")
q("procedural", "bob", "How do I request a refund?", "Request refund")
q("procedural", "alice", "How do I rotate the credentials of Sentinel?", "Rotate now")
q("procedural", "alice", "How do I submit an expense?", "expenses app")
q("procedural", "bob", "How do I cancel a subscription?", "Cancel plan")
q("procedural", "bob", "How do I change the billing address?", "edit the address")
q("multi_hop", "bob", "Which team owns Relay, and who leads it?", "Ivan Petrov")
q("multi_hop", "alice", "Which team owns Quill, and when is its planning meeting?", "Friday")
q("multi_hop", "bob", "Which service stores invoices, and what is its uptime target?", "99.9 percent")
q("multi_hop", "alice", "Which service scans uploads for malware, and who is its escalation contact?", "Noor Aziz")
q("multi_hop", "bob", "Which team owns Cobalt, and who leads it?", "Kwame Mensah")
q("paraphrase", "bob", "what is the refund window for annual plans", "30 days")
q("paraphrase", "alice", "How long is the refund period for yearly plans?", "30 days")
q("paraphrase", "bob", "What's the refund window for monthly plans?", "7 days")
q("paraphrase", "alice", "How do I restart Ledger?", "nwctl restart ledger")
q("paraphrase", "bob", "How long does the free trial last?", "14 days")
q("paraphrase", "alice", "When do API keys expire?", "180 days")
q("paraphrase", "bob", "Which team owns Relay, and who leads it?", "Ivan Petrov")
q("access", "bob", "How do I restart Ledger?", None)
q("access", "alice", "When was the last major incident on Harbor?", "2026-02-27")
q("access", "bob", "When was the last major incident on Harbor?", None)
q("simple_fact", "alice", "What is the learning budget per employee?", "1500 euros")
q("simple_fact", "bob", "Which team owns Atlas?", "Geo")
q("simple_fact", "alice", "What is the expense limit for team dinners?", "60 euros")
q("simple_fact", "bob", "Is multi-factor authentication required for admin accounts?", "required for every admin account")
for i, w in enumerate(W, 1):
    w["id"] = f"q{i:02d}"; w["quick"] = i <= QUICK
with open(str(HERE / "workload.jsonl"), "w") as f:
    for w in W: f.write(json.dumps({k: w[k] for k in ("id", "kind", "principal", "question", "quick")}) + "\n")
with open(str(HERE / "gold.jsonl"), "w") as f:
    for w in W: f.write(json.dumps({"id": w["id"], "answer": w["gold"]}) + "\n")
print(len(W), QUICK)
