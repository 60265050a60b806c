#!/usr/bin/python3
"""console_check.py - the web console (/ui/) in a real browser.

Drives headless Chromium through chromedriver (Debian's python3-selenium
and chromium-driver) against a coordinator that console.sh set up, and
checks the rendered DOM against what the API says:

  cluster   every node is a tile (data-node) whose class is its health:
            the stalled node h-stalled with its stalled accelerator's cell
            h-stalled, the killed node h-down, the others h-ready; the
            summary counts them; services and frontends are listed, the
            frontend with the service it produces into; the events list
            shows the registrations, the node declared down and the
            accelerator taken out of dispatch.
  rates     the node detail's requests/s of a simulated node's
            accelerators, within 30% of what lynx-simnodes --rate reports.
  drain     the drain button of a node's detail: without the API token
            the coordinator refuses it (401, shown in the status line,
            the node stays ready); with it the node drains (the tile's
            class and the API agree), a node_draining event appears; the
            undrain button brings it back.
  leaving   (--leaving-node) a node whose agent is stopping shows
            "(leaving)" beside its state, on its tile and in its detail,
            and its detail has no drain or undrain button.
  scale     (--scale-nodes N) with about 10,000 accelerators the page
            shows one page of tiles and the canvas, and the document stays
            small: not one element per accelerator.

Screenshots go to --shots (for people to look at). Exit 0 when every
check passed, 1 otherwise (a browser that is installed but does not start
included: that is a failure, not a skip), 77 when python3-selenium is
missing. Every wait is multiplied by the time scale (LYNX_TEST_TIME_SCALE,
docs/testing.md).
"""
import argparse
import os
import json
import sys
import time
import urllib.request

try:
    from selenium import webdriver
    from selenium.common.exceptions import (StaleElementReferenceException,
                                            TimeoutException,
                                            WebDriverException)
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as e:  # checked by console.sh too
    print(f"SKIP: python3-selenium is not installed: {e}")
    sys.exit(77)

FAILED = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILED.append(what)
    return ok


def api(base, path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.load(r)


def all_items(base, path):
    items, after = [], None
    while True:
        q = f"{path}?limit=1000" + (f"&after={after}" if after else "")
        r = api(base, q)
        items += r["items"]
        if not r.get("next"):
            return items
        after = r["next"]


def browser(chromedriver):
    o = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage", "--window-size=1400,1000"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(service=Service(chromedriver), options=o)
    except WebDriverException as e:
        # chromium and chromedriver are there (console.sh checked): a
        # browser that does not start is a failure
        print(f"FAIL: Chromium (installed) did not start: {e.msg}")
        sys.exit(1)


TIME_SCALE = int(os.environ.get("LYNX_TEST_TIME_SCALE", "1"))


def wait(d, what, cond, secs=20):
    secs *= TIME_SCALE
    try:
        # the page redraws what it shows on every refresh: an element found
        # just before may be gone; look again
        return WebDriverWait(d, secs, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException]
                             ).until(lambda d: cond(d))
    except TimeoutException:
        check(False, f"{what} (waited {secs} s)")
        return None


def tile_class(d, node):
    """The class of node's tile, read in one step (the page redraws)."""
    return d.execute_script(
        "const t = document.querySelector(`.node[data-node=\"${arguments[0]}\"]`);"
        "return t ? t.className : null", node)


def console_errors(d):
    """Errors the page's scripts logged (a refused request the test
    provoked shows as a network error, not a script error)."""
    return [l["message"] for l in d.get_log("browser")
            if l["level"] == "SEVERE" and l.get("source") != "network"]


def cluster(d, a):
    base = a.api
    nodes = {n["id"]: n for n in all_items(base, "/v1/nodes")}
    accels = all_items(base, "/v1/accelerators")
    d.get(base + "/ui/")
    wait(d, "node tiles rendered",
         lambda d: len(d.find_elements(By.CSS_SELECTOR, ".node[data-node]"))
         >= len(nodes))
    # no accelerator has a rate yet (that takes RATE_SPAN_MS of heartbeats):
    # the summary says '-', not 0 requests/s, under load as it is
    known, text = d.execute_script(
        "return [st.rates.size, document.getElementById('sum-rate').textContent]")
    check(known > 0 or text == "- requests/s",
          f"the summary's rate before any is known: '{text}' ({known} known)")
    shown = {t.get_attribute("data-node"): t.get_attribute("class")
             for t in d.find_elements(By.CSS_SELECTOR, ".node[data-node]")}
    check(set(shown) == set(nodes),
          f"a tile for each of the {len(nodes)} nodes the API lists "
          f"(missing {sorted(set(nodes) - set(shown))}, "
          f"extra {sorted(set(shown) - set(nodes))})")
    for n in nodes:
        want = ("h-stalled" if n == a.stalled_node else
                "h-down" if n == a.down_node else
                f"h-{nodes[n]['state']}" if n == a.leaving_node else "h-ready")
        check(want in (shown.get(n) or "").split(),
              f"tile {n}: class {want} (has '{shown.get(n)}')")
    stalled = [x["id"] for x in accels
               if x["node"] == a.stalled_node and x["health"]["stalled_mqueues"]]
    check(len(stalled) == 1, f"the API reports one stalled accelerator on "
          f"{a.stalled_node}: {stalled}")
    for acc in stalled:
        c = d.find_elements(By.CSS_SELECTOR, f'.cell[data-accel="{acc}"]')
        check(bool(c) and "h-stalled" in c[0].get_attribute("class").split(),
              f"accelerator {acc}'s cell is h-stalled")
    summary = d.find_element(By.ID, "summary").text
    n_ready = sum(1 for n in nodes.values() if n["state"] == "ready")
    check(f"{len(nodes)} nodes: {n_ready} ready" in summary and "1 down" in summary
          and f"{len(accels)} accelerators" in summary and "1 stalled" in summary,
          f"summary counts nodes, down, accelerators and stalled: '{summary}'")
    svc = d.find_elements(By.CSS_SELECTOR, f'tr[data-service="{a.service}"]')
    check(bool(svc), f"service {a.service} listed")
    fe = d.find_elements(By.CSS_SELECTOR, "tr[data-frontend]")
    check(len(fe) == 1 and f"{a.service}:" in fe[0].text,
          f"the frontend listed with the mqueues it produces into: "
          f"{[f.text for f in fe]}")
    ev = wait(d, "events: registrations, node down, accelerator out", lambda d: (
        lambda kinds: kinds if {"node_registered", "node_down", "accel_out"}
        <= kinds else None)({li.get_attribute("class")[2:] for li in
                             d.find_elements(By.CSS_SELECTOR, "#events li")}))
    if ev:
        check(True, f"event kinds shown: {sorted(ev)}")
    d.save_screenshot(f"{a.shots}/console.png")


def leaving(d, a):
    """A node whose agent is stopping: "(leaving)" beside its state, on its
    tile and in its detail, and no undrain button (the API refuses)."""
    node = a.leaving_node
    n = api(a.api, f"/v1/nodes/{node}")
    check(n["leaving"] is True and n["state"] in ("draining", "drained"),
          f"the API: {node} drains to leave ({n['state']}, leaving "
          f"{n['leaving']})")
    tile = wait(d, f"{node}'s tile says leaving", lambda d: (
        lambda t: t if t and "(leaving)" in t.text else None)(
            (d.find_elements(By.CSS_SELECTOR, f'.node[data-node="{node}"]')
             or [None])[0]))
    if not tile:
        return
    check(f"{n['state']} (leaving)" in tile.text,
          f"tile {node} shows '{n['state']} (leaving)': '{tile.text}'")
    tile.click()
    shown = wait(d, f"{node}'s detail", lambda d: (
        d.find_element(By.ID, "detail-id").text == node or None))
    if not shown:
        return
    check("(leaving)" in d.find_element(By.ID, "detail-state").text,
          f"detail of {node} says leaving")
    check(not d.find_element(By.ID, "detail-drain").is_displayed(),
          f"detail of {node} has no drain or undrain button")


def drain(d, a):
    base, node = a.api, a.drain_node

    def state():
        return api(base, f"/v1/nodes/{node}")["state"]

    d.find_element(By.CSS_SELECTOR, f'.node[data-node="{node}"]').click()
    btn = wait(d, "the node's detail with a drain button", lambda d: (
        lambda b: b if b.is_displayed() and b.text == "drain" else None)(
            d.find_element(By.ID, "detail-drain")))
    if not btn:
        return
    check(d.find_element(By.ID, "detail-id").text == node,
          f"detail shows node {node}")
    rows = d.find_elements(By.CSS_SELECTOR, "#detail-accels tr[data-accel]")
    check(len(rows) == a.drain_accels,
          f"detail lists its {a.drain_accels} accelerators ({len(rows)})")
    # request rates: the simulator's accelerator k (node index x accels +
    # index) takes rate x (1 + k % 7) requests/s
    want = {f"{node}/{i}": a.rate * (1 + (a.drain_index * a.drain_accels + i) % 7)
            for i in range(a.drain_accels)}

    def rates(d):
        got = d.execute_script(
            "return [...document.querySelectorAll('#detail-accels tr[data-accel]')]"
            ".map(r => [r.dataset.accel, r.children[4].textContent])")
        got = {k: float(v.replace(",", "")) for k, v in got if v != "-"}
        return got if got.keys() == want.keys() and all(
            abs(got[k] - w) <= 0.3 * w for k, w in want.items()) else None
    got = wait(d, f"request rates within 30% of {want}", rates, secs=30)
    if got:
        check(True, f"request rates {got} (the simulator's {want})")
        text = d.find_element(By.ID, "sum-rate").text
        total = text.split(" ")[0].replace(",", "")
        check(total.replace(".", "", 1).isdigit() and float(total) >=
              0.7 * sum(want.values()),
              f"the summary's rate counts them: '{text}'")
    # without the token: refused (401), said, nothing changed
    d.find_element(By.ID, "token").clear()
    btn.click()
    wait(d, "the refusal shown", lambda d: "401" in d.find_element(
        By.ID, "action").text)
    check(state() == "ready", f"{node} still ready after a drain without the token")
    # with it
    d.find_element(By.ID, "token").send_keys(a.token)
    btn.click()
    wait(d, "the tile drained", lambda d: (tile_class(d, node) or "").split()
         and {"h-draining", "h-drained"} & set(tile_class(d, node).split()))
    check(state() in ("draining", "drained"),
          f"{node} drains through the button (API: {state()})")
    wait(d, "a node_draining event", lambda d: any(
        node in li.text for li in d.find_elements(
            By.CSS_SELECTOR, "#events li.k-node_draining")))
    d.save_screenshot(f"{a.shots}/console-drained.png")
    btn = wait(d, "an undrain button", lambda d: (
        lambda b: b if b.text == "undrain" else None)(
            d.find_element(By.ID, "detail-drain")))
    if btn:
        btn.click()
        wait(d, "the tile ready again", lambda d: "h-ready" in (
            tile_class(d, node) or "").split())
        check(state() == "ready", f"{node} undrained through the button")


def scale(d, a):
    base = a.api
    n_acc = len(all_items(base, "/v1/accelerators"))
    n_nodes = len(all_items(base, "/v1/nodes"))
    check(n_acc >= 10000, f"the API lists {n_acc} accelerators (>= 10,000)")
    d.get(base + "/ui/")
    wait(d, f"summary with {n_acc} accelerators",
         lambda d: f"{n_acc} accelerators" in d.find_element(By.ID, "summary").text,
         secs=60)
    tiles = len(d.find_elements(By.CSS_SELECTOR, ".node[data-node]"))
    elements = d.execute_script("return document.getElementsByTagName('*').length")
    canvas = d.execute_script(
        "const c = document.getElementById('heatmap'); return [c.width, c.height]")
    check(tiles == 200, f"one page of node tiles shown: {tiles} of {n_nodes}")
    check(elements < 5000, f"the document holds {elements} elements for "
          f"{n_acc} accelerators (not one per accelerator)")
    check(canvas[0] > 0 and canvas[1] > 0, f"the heatmap canvas drawn ({canvas})")
    check(f"page 1 of {(n_nodes + 199) // 200}" in d.find_element(By.ID, "page").text,
          f"paging: '{d.find_element(By.ID, 'page').text}'")
    f = d.find_element(By.ID, "filter")
    f.send_keys(a.scale_probe)
    wait(d, f"the filter finds {a.scale_probe}", lambda d: [
        t.get_attribute("data-node") for t in d.find_elements(
            By.CSS_SELECTOR, ".node[data-node]")] == [a.scale_probe])
    d.save_screenshot(f"{a.shots}/console-10k.png")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--api", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--stalled-node", required=True)
    p.add_argument("--down-node", required=True)
    p.add_argument("--drain-node", required=True)
    p.add_argument("--drain-accels", type=int, required=True)
    p.add_argument("--leaving-node", help="a node draining to leave (lynx-simnodes --leaving)")
    p.add_argument("--drain-index", type=int, default=1,
                   help="the drain node's index among the simulated nodes")
    p.add_argument("--rate", type=float, default=100,
                   help="lynx-simnodes --rate")
    p.add_argument("--scale-probe", help="run the scale part: a node id to filter")
    p.add_argument("--shots", required=True)
    p.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    a = p.parse_args()
    d = browser(a.chromedriver)
    try:
        if a.scale_probe:
            scale(d, a)
        else:
            cluster(d, a)
            if a.leaving_node:
                leaving(d, a)
            drain(d, a)
        errs = console_errors(d)
        check(not errs, f"no script error in the page: {errs}")
    finally:
        d.quit()
    if FAILED:
        print(f"{len(FAILED)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
