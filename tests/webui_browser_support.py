"""The browser, the page's elements and the server's state for tests/webui_browser_test.py.

Every wait is an explicit WebDriverWait on a condition; nothing sleeps and nothing is timed.
"""
import json
import os
import shutil
import sys
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = os.environ["KVSERVE_URL"].rsplit("/v1", 1)[0] + "/"
KEY = os.environ["KVSERVE_API_KEY"]
SCREENSHOTS = os.environ.get("KVSERVE_WEBUI_SCREENSHOTS", "webui-screenshots")
WINDOW = (1200, 800)  # the screenshots' size (docs/images/webui-*.png)

# Every request body the page sends is kept in window.sentBodies (the page's own fetch goes on as before).
RECORD_REQUESTS = """
if (!window.sentBodies) {
  window.sentBodies = [];
  const realFetch = window.fetch;
  window.fetch = (url, options) => {
    if (options && options.body) window.sentBodies.push(JSON.parse(options.body));
    return realFetch(url, options);
  };
}
"""

# The length of the answers' text after each change the page made to it, in order: streamed text grows in steps.
# Read from the nodes each change put in (the observer may run once for several changes, after the last).
RECORD_LENGTHS = """
window.answerLengths = [];
new MutationObserver((records) => {
  for (const r of records)
    if (r.type === 'childList' && r.target.matches('.assistant .content'))
      window.answerLengths.push([...r.addedNodes].reduce((n, node) => n + node.textContent.length, 0));
}).observe(document.getElementById('messages'), {subtree: true, childList: true});
"""

# Each text the note under a waiting answer was given ("Loading MODEL…"), in order, once each time it changed.
RECORD_PENDING = """
window.pendingNotes = [];
new MutationObserver((records) => {
  for (const r of records) {
    const text = r.target.matches('.pending') ? [...r.addedNodes].map((n) => n.textContent).join('') : '';
    if (text && window.pendingNotes.at(-1) !== text) window.pendingNotes.push(text);
  }
}).observe(document.getElementById('messages'), {subtree: true, childList: true});
"""

# The next /v1/chat/completions is answered by the page itself with these SSE events (arguments[0]), one per
# turn of the event loop, as a server's stream would come: the answer's text is then exactly what we chose.
STUB_NEXT_ANSWER = """
const events = arguments[0];
const realFetch = window.fetch;
window.fetch = (url, options) => {
  if (url !== '/v1/chat/completions') return realFetch(url, options);
  window.fetch = realFetch;
  const encoder = new TextEncoder();
  let next = 0;
  const body = new ReadableStream({
    async pull(controller) {
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (next < events.length) controller.enqueue(encoder.encode('data: ' + events[next++] + '\\n\\n'));
      else controller.close();
    },
  });
  return Promise.resolve(new Response(body, {headers: {'Content-Type': 'text/event-stream'}}));
};
"""


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def start_browser():
    browser = next(filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))), None)
    driver_path = shutil.which("chromedriver")
    if not browser or not driver_path:
        skip("needs Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--hide-scrollbars", "--force-device-scale-factor=1", "--window-size=%d,%d" % WINDOW):
        options.add_argument(arg)
    try:  # the driver named here: Selenium Manager, which would download one, stays out
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except WebDriverException as e:
        skip(f"Chromium did not start: {e.msg}")
    # The page's viewport exactly WINDOW (the window's size would include the browser's frame).
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
    return driver


def wait_for(driver, condition, what, timeout=120):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d), message=what)


def screenshot(driver, name):
    """The page (the window's inner size, WINDOW) as SCREENSHOTS/webui-NAME.png."""
    os.makedirs(SCREENSHOTS, exist_ok=True)
    path = os.path.join(SCREENSHOTS, f"webui-{name}.png")
    driver.save_screenshot(path)
    print("screenshot:", path, os.path.getsize(path), "bytes")


def find(driver, css):
    return driver.find_element(By.CSS_SELECTOR, css)


def find_all(driver, css):
    return driver.find_elements(By.CSS_SELECTOR, css)


def set_value(driver, css, value):
    field = find(driver, css)
    field.clear()
    field.send_keys(str(value))


def pick_model(driver, model_id):
    Select(find(driver, "#model")).select_by_value(model_id)


def model_options(driver):
    """The picker's lines: {id: label}."""
    return {o.get_attribute("value"): o.text for o in find_all(driver, "#model option")}


def answers(driver):
    return [e.text for e in find_all(driver, "#messages .assistant .content")]


def last_answer(driver):
    return find_all(driver, "#messages .assistant")[-1]


def send(driver, text):
    """Sends `text`; returns once the answer began. The page adds the answer's element and enables Stop in one
    step, so a new element is the sign: Stop itself may be enabled and disabled again between two polls when the
    answer is short (a stubbed stream ends in milliseconds)."""
    before = len(find_all(driver, "#messages .assistant"))
    set_value(driver, "#message", text)
    find(driver, "#send").click()
    wait_for(driver, lambda d: len(find_all(d, "#messages .assistant")) > before, "the answer to start streaming")


def wait_answered(driver):
    wait_for(driver, lambda d: find(d, "#stop").get_property("disabled"), "the answer to end")
    return last_answer(driver)


def growth_steps(driver, at_least):
    """The distinct lengths the last answer's text had; at least `at_least` of them (it grew while streaming)."""
    lengths = driver.execute_script("return window.answerLengths")
    steps = sorted(set(n for n in lengths if n > 0))
    assert len(steps) >= at_least, f"the text did not arrive in steps: {lengths}"
    return steps


def stats_of(answer):
    return answer.find_element(By.CSS_SELECTOR, ".tokens-per-second").text


def server_get(path):
    """GET ROOT+path from the server itself (with the key): parsed JSON, or the text for /metrics."""
    request = urllib.request.Request(ROOT + path, headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read().decode()
    return json.loads(body) if response.headers.get_content_type() == "application/json" else body


def server_statuses():
    """/v1/models as {id: status} ("loaded", "loading", "unloaded"; None on a one-model server)."""
    return {m["id"]: m.get("status", {}).get("value") for m in server_get("v1/models")["data"]}


def metric(name):
    for line in server_get("metrics").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"/metrics has no {name}")


def sse_event(content="", reasoning="", usage=None, model="stub"):
    """One chat.completion.chunk as the server streams it."""
    event = {"object": "chat.completion.chunk", "model": model, "choices": []}
    if content or reasoning:
        delta = {"content": content} if content else {"reasoning_content": reasoning}
        event["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
    if usage:
        event["usage"] = usage
    return json.dumps(event)
