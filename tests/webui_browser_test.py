"""kvserve serve's chat page (GET /) in a real browser: headless Chromium driven by Selenium.

Run by scripts/openai_client_test.sh (KVSERVE_TEST_PACKAGES="selenium"), which starts the server with an API
key on the real default model and sets KVSERVE_URL (".../v1") and KVSERVE_API_KEY. Exits 77 (skipped, with a
message) without Chromium or its driver (Debian: chromium, chromium-driver). Screenshots go to the folder
KVSERVE_WEBUI_SCREENSHOTS (default: webui-screenshots/ in the working directory); docs/images/webui-*.png are
from a run with KVSERVE_WEBUI_SCREENSHOTS=docs/images.
"""
import os
import shutil
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = os.environ["KVSERVE_URL"].rsplit("/v1", 1)[0] + "/"
KEY = os.environ["KVSERVE_API_KEY"]
MODEL_ID = "smollm2-135m-instruct-q4_1"
SCREENSHOTS = os.environ.get("KVSERVE_WEBUI_SCREENSHOTS", "webui-screenshots")

# The lengths of the last answer's text at each change of the page: streamed text grows in steps.
RECORD_LENGTHS = """
window.answerLengths = [];
new MutationObserver(() => {
  const answers = document.querySelectorAll('#messages .assistant .content');
  if (answers.length) window.answerLengths.push(answers[answers.length - 1].textContent.length);
}).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
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
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1000,700"):
        options.add_argument(arg)
    try:  # the driver named here: Selenium Manager, which would download one, stays out
        return webdriver.Chrome(service=Service(driver_path), options=options)
    except WebDriverException as e:
        skip(f"Chromium did not start: {e.msg}")


def wait_for(driver, condition, what, timeout=120):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d), message=what)


def screenshot(driver, name):
    os.makedirs(SCREENSHOTS, exist_ok=True)
    path = os.path.join(SCREENSHOTS, f"webui-{name}.png")
    driver.save_screenshot(path)
    print("screenshot:", path)


def find(driver, css):
    return driver.find_element(By.CSS_SELECTOR, css)


def set_value(driver, css, value):
    field = find(driver, css)
    field.clear()
    field.send_keys(str(value))


def model_ids(driver):
    return [o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#model option")]


def answers(driver):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#messages .assistant .content")]


def send(driver, text):
    set_value(driver, "#message", text)
    find(driver, "#send").click()
    wait_for(driver, lambda d: not find(d, "#stop").get_property("disabled"), "the answer to start streaming")


def wait_answered(driver):
    wait_for(driver, lambda d: find(d, "#stop").get_property("disabled"), "the answer to end")
    return driver.find_elements(By.CSS_SELECTOR, "#messages .assistant")[-1]


def growth_steps(driver, at_least):
    """The distinct lengths the last answer's text had; at least `at_least` of them (it grew while streaming)."""
    lengths = driver.execute_script("return window.answerLengths")
    steps = sorted(set(n for n in lengths if n > 0))
    assert len(steps) >= at_least, f"the text did not arrive in steps: {lengths}"
    return steps


def check_key_prompt_and_models(driver):
    driver.get(ROOT)
    form = find(driver, "#api-key-form")
    wait_for(driver, lambda d: form.is_displayed(), "the API key form (the server has a key)")
    screenshot(driver, "api-key")
    set_value(driver, "#api-key", KEY)
    find(driver, "#api-key-save").click()
    wait_for(driver, lambda d: MODEL_ID in model_ids(d), "the model list")
    assert not form.is_displayed()
    print("models listed:", model_ids(driver))


def check_streamed_answer(driver):
    set_value(driver, "#system", "You are a helpful assistant.")
    set_value(driver, "#temperature", 0)
    set_value(driver, "#max-tokens", 48)
    driver.execute_script(RECORD_LENGTHS)
    send(driver, "What is the capital of France?")
    answer = wait_answered(driver)
    steps = growth_steps(driver, 2)
    text = answer.find_element(By.CSS_SELECTOR, ".content").text
    stats = answer.find_element(By.CSS_SELECTOR, ".tokens-per-second").text
    assert text and "tokens/s" in stats and "counted" not in stats, (text, stats)  # usage came with the stream
    print(f"streamed answer in {len(steps)} steps: {text!r}; {stats}")


def check_stop_keeps_partial_answer(driver):
    set_value(driver, "#max-tokens", 400)
    set_value(driver, "#temperature", 0.8)
    set_value(driver, "#seed", 7)  # the same story every run: long enough to stop
    driver.execute_script(RECORD_LENGTHS)
    send(driver, "Tell me a long story about a dragon who learns to cook, with many details.")
    wait_for(driver, lambda d: len(answers(d)[-1]) > 40, "some of the long answer", timeout=60)
    find(driver, "#stop").click()
    growth_steps(driver, 3)
    answer = wait_answered(driver)
    partial = answer.find_element(By.CSS_SELECTOR, ".content").text
    stats = answer.find_element(By.CSS_SELECTOR, ".tokens-per-second").text
    time.sleep(1)
    assert answer.find_element(By.CSS_SELECTOR, ".content").text == partial, "text arrived after Stop"
    assert partial and "stopped" in stats, (partial, stats)
    tokens = int(stats.split(" ")[0])
    assert 0 < tokens < 400, stats
    print(f"stopped after {tokens} tokens: {partial[:80]!r}...; {stats}")
    screenshot(driver, "chat")


def check_reload_restores(driver):
    before = answers(driver)
    messages = len(driver.find_elements(By.CSS_SELECTOR, "#messages .message"))
    driver.refresh()
    wait_for(driver, lambda d: MODEL_ID in model_ids(d), "the model list after reload (key kept)")
    assert answers(driver) == before, (answers(driver), before)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#messages .message")) == messages == 4
    assert find(driver, "#max-tokens").get_property("value") == "400"
    assert find(driver, "#model").get_property("value") == MODEL_ID
    print(f"reload restored {messages} messages and the settings")


def check_model_text_is_never_html(driver):
    rendered = driver.execute_script("""
      const box = document.createElement('div');
      box.append(window.kvserveChat.renderText(
        'Hi <b>x</b> <script>window.pwned = 1</script>\\n\\n```html\\n<i>y</i>\\n```\\nand `<u>z</u>` <img src=x onerror="window.pwned = 2">'));
      return {tags: [...box.querySelectorAll('*')].map(e => e.tagName), text: box.textContent,
              code: box.querySelector('pre code').textContent, lang: box.querySelector('pre code').className};""")
    assert rendered["tags"] == ["P", "PRE", "CODE", "P", "CODE"], rendered
    assert "<b>x</b> <script>window.pwned = 1</script>" in rendered["text"], rendered
    assert rendered["code"] == "<i>y</i>" and rendered["lang"] == "language-html", rendered

    set_value(driver, "#max-tokens", 40)
    set_value(driver, "#temperature", 0)
    prompt = 'Repeat exactly: <b>x</b> <script>window.pwned = 1</script> <img src=x onerror="window.pwned = 2">'
    send(driver, prompt)
    wait_answered(driver)
    users = driver.find_elements(By.CSS_SELECTOR, "#messages .user .content")
    assert users[-1].text == prompt, users[-1].text
    assert not driver.find_elements(By.CSS_SELECTOR, "#messages b, #messages script, #messages img, #messages i")
    assert driver.execute_script("return window.pwned") is None
    print("model and user text shown as text:", repr(answers(driver)[-1][:80]))


def check_reasoning_and_stream_parsing(driver):
    result = driver.execute_script("""
      const chat = window.kvserveChat;
      const events = [];
      const parser = chat.createSseParser(d => events.push(d));
      parser.push('data: {"a"'); parser.push(':1}\\r\\n\\r\\ndata: [DONE]\\n\\n');
      const message = chat.page.messageElement(
        {role: 'assistant', content: '<think>plan <b>it</b></think>Done', reasoning: '', stats: null});
      const details = message.querySelector('details.reasoning');
      return {events, open: chat.splitThinking('<think>still'), closed: chat.splitThinking('a</think> b'),
              hidden: details.hidden, folded: !details.open, reasoning: details.textContent,
              answer: message.querySelector('.content').textContent};""")
    assert result["events"] == ['{"a":1}', "[DONE]"], result
    assert result["open"] == {"reasoning": "still", "answer": "", "thinking": True}, result
    assert result["closed"] == {"reasoning": "a", "answer": "b", "thinking": False}, result
    assert not result["hidden"] and result["folded"], result
    assert result["reasoning"] == "Reasoningplan <b>it</b>" and result["answer"] == "Done", result


def check_new_chat(driver):
    find(driver, "#new-chat").click()
    assert not driver.find_elements(By.CSS_SELECTOR, "#messages .message")
    driver.refresh()
    wait_for(driver, lambda d: MODEL_ID in model_ids(d), "the model list after New chat")
    assert not driver.find_elements(By.CSS_SELECTOR, "#messages .message")
    set_value(driver, "#max-tokens", 120)
    send(driver, "Write a Python function that adds two numbers, in a code block.")
    wait_answered(driver)
    print("code answer:", driver.find_elements(By.CSS_SELECTOR, "#messages .assistant pre") != [])
    screenshot(driver, "code")


def main():
    driver = start_browser()
    try:
        check_key_prompt_and_models(driver)
        check_streamed_answer(driver)
        check_stop_keeps_partial_answer(driver)
        check_reload_restores(driver)
        check_model_text_is_never_html(driver)
        check_reasoning_and_stream_parsing(driver)
        check_new_chat(driver)
        # (The first /v1/models, before the key, is a 401 the console reports.)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and " 401 " not in e["message"]]
        assert not errors, errors
    finally:
        driver.quit()
    print("chat page OK")


if __name__ == "__main__":
    main()
