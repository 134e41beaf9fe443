"""kvserve serve's chat page (GET /) in a real browser: headless Chromium driven by Selenium.

Run by scripts/openai_client_test.sh (KVSERVE_TEST_PACKAGES="selenium"), which starts the server with an API
key on the real default model, plus the models of KVSERVE_TEST_MODELS (ctest: stories260k, so that the page
switches between two models under --models-max 1), and sets KVSERVE_URL (".../v1") and KVSERVE_API_KEY. Exits 77
(skipped, with a message) without Chromium or its driver (Debian: chromium, chromium-driver). Screenshots go to
the folder KVSERVE_WEBUI_SCREENSHOTS (default: webui-screenshots/ in the working directory); docs/images/webui-*.png
are from a run with KVSERVE_WEBUI_SCREENSHOTS=docs/images. Helpers: tests/webui_browser_support.py.
"""
import os

from webui_browser_support import (KEY, RECORD_LENGTHS, RECORD_PENDING, RECORD_REQUESTS, ROOT, STUB_NEXT_ANSWER,
                                   answers, find, find_all, growth_steps, metric, model_options, pick_model,
                                   screenshot, send, server_statuses, set_value, sse_event, start_browser,
                                   stats_of, wait_answered, wait_for)
from selenium.webdriver.common.by import By

MODEL_ID = "smollm2-135m-instruct-q4_1"
OTHER_MODELS = [os.path.basename(p).removesuffix(".gguf") for p in os.environ.get("KVSERVE_TEST_MODELS", "").split()]
SYSTEM_PROMPT = "You are a terse assistant. Answer in one sentence."


def check_key_prompt_and_models(driver):
    driver.get(ROOT)
    form = find(driver, "#api-key-form")
    wait_for(driver, lambda d: form.is_displayed(), "the API key form (the server has a key)")
    screenshot(driver, "api-key")
    set_value(driver, "#api-key", KEY)
    find(driver, "#api-key-save").click()
    wait_for(driver, lambda d: MODEL_ID in model_options(d), "the model list")
    assert not form.is_displayed()
    driver.get_log("browser")  # the first /v1/models was a 401 (the key form's cue): no other may follow
    options = model_options(driver)
    assert sorted(options) == sorted(server_statuses()) == sorted([MODEL_ID] + OTHER_MODELS), options
    if OTHER_MODELS:  # nothing is loaded before a request names it: the picker says so
        assert all(label == f"{i} (not loaded)" for i, label in options.items()), options
        pick_model(driver, MODEL_ID)
        assert find(driver, "#model-status").text == "not loaded: loads on the first message"
    print("models listed:", options)


def check_settings_sent_and_streamed(driver):
    driver.execute_script(RECORD_REQUESTS + RECORD_LENGTHS + RECORD_PENDING)
    settings = {"#system": SYSTEM_PROMPT, "#temperature": 0, "#top-p": 0.9, "#max-tokens": 48, "#seed": 11}
    for css, value in settings.items():
        set_value(driver, css, value)
    send(driver, "What is the capital of France?")
    answer = wait_answered(driver)
    body = driver.execute_script("return window.sentBodies.at(-1)")
    assert body["model"] == MODEL_ID and body["stream"] is True and body["stream_options"]["include_usage"], body
    assert body["messages"] == [{"role": "system", "content": SYSTEM_PROMPT},
                                {"role": "user", "content": "What is the capital of France?"}], body
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0, 0.9, 48, 11), body
    steps = growth_steps(driver, 2)
    text = answer.find_element(By.CSS_SELECTOR, ".content").text
    stats = stats_of(answer)
    assert text and "tokens/s" in stats and "counted" not in stats, (text, stats)  # usage came with the stream
    assert 0 < int(stats.split(" ")[0]) <= 48, stats  # the server kept to the page's max_tokens
    assert answer.find_element(By.CSS_SELECTOR, ".role").text == f"Assistant ({MODEL_ID})"
    if OTHER_MODELS:  # the request loaded the model: the answer said so while it waited, the picker after
        check_loading_noted(driver, answer, MODEL_ID)
        wait_for(driver, lambda d: model_options(d)[MODEL_ID] == MODEL_ID, "the picker to show the model loaded")
        assert find(driver, "#model-status").text == "loaded"
    print(f"sent {body}; streamed answer in {len(steps)} steps: {text!r}; {stats}")


def check_loading_noted(driver, answer, model_id):
    """The note under an answer sent to a model not loaded: "Loading MODEL…" from the send (the page knew the
    model was not loaded), gone once the text came."""
    assert driver.execute_script("return window.pendingNotes") == [f"Loading {model_id}…"]
    assert not answer.find_element(By.CSS_SELECTOR, ".pending").is_displayed()


def check_stop_keeps_partial_answer(driver):
    set_value(driver, "#max-tokens", 400)
    set_value(driver, "#temperature", 0.8)
    set_value(driver, "#seed", 7)  # the same story every run: long enough to stop
    driver.execute_script(RECORD_LENGTHS)
    send(driver, "Tell me a long story about a dragon who learns to cook, with many details.")
    wait_for(driver, lambda d: len(answers(d)[-1]) > 40, "some of the long answer", timeout=60)
    find(driver, "#stop").click()
    answer = wait_answered(driver)
    partial = answer.find_element(By.CSS_SELECTOR, ".content").text
    stats = stats_of(answer)
    assert partial and "stopped" in stats, (partial, stats)
    tokens = int(stats.split(" ")[0])
    assert 0 < tokens < 400, stats
    # The server cancelled the request (nothing runs or waits), and no text came after Stop.
    wait_for(driver, lambda d: metric("kvserve_requests_running") == metric("kvserve_requests_waiting") == 0,
             "the server to cancel the stopped request")
    assert answer.find_element(By.CSS_SELECTOR, ".content").text == partial, "text arrived after Stop"
    lengths = driver.execute_script("return window.answerLengths")
    assert lengths[-1] == len(answer.find_element(By.CSS_SELECTOR, ".content").get_property("textContent"))
    growth_steps(driver, 3)
    print(f"stopped after {tokens} tokens: {partial[:80]!r}...; {stats}")
    screenshot(driver, "chat")


def check_reload_restores(driver):
    before = answers(driver)
    messages = len(find_all(driver, "#messages .message"))
    driver.refresh()
    wait_for(driver, lambda d: MODEL_ID in model_options(d), "the model list after reload (key kept)")
    assert not find(driver, "#api-key-form").is_displayed(), "the key was asked again"
    assert driver.execute_script("return localStorage.getItem('kvserve.webui.apiKey')") == f'"{KEY}"'
    assert answers(driver) == before, (answers(driver), before)
    assert len(find_all(driver, "#messages .message")) == messages == 4
    assert all("tokens/s" in stats_of(a) for a in find_all(driver, "#messages .assistant")), "tokens/s per answer"
    assert find(driver, "#max-tokens").get_property("value") == "400"
    assert find(driver, "#system").get_property("value") == SYSTEM_PROMPT
    assert find(driver, "#model").get_property("value") == MODEL_ID
    print(f"reload restored {messages} messages, the settings and the key")


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
    users = find_all(driver, "#messages .user .content")
    assert users[-1].text == prompt, users[-1].text
    assert not find_all(driver, "#messages b, #messages script, #messages img, #messages i")
    assert driver.execute_script("return window.pwned") is None
    print("model and user text shown as text:", repr(answers(driver)[-1][:80]))


STUB_REASONING = "The user wants a function. I will write it in Python."
STUB_CODE = "def add(a, b):\n    return a + b"
STUB_ANSWER = ['Here it is <img src=x onerror="window.pwned = 3">:\n\n', "```python\n", STUB_CODE + "\n", "```\n\n",
               "Call `add(1, 2)` <script>window.pwned = 4</script>"]


def stub_events():
    """A reasoning model's stream: <think> in the text, the answer with markup and a code block, then usage."""
    events = [sse_event("<think>"), sse_event(STUB_REASONING[:20]), sse_event(STUB_REASONING[20:]),
              sse_event("</think>\n\n")]
    events += [sse_event(part) for part in STUB_ANSWER]
    return events + [sse_event(usage={"prompt_tokens": 30, "completion_tokens": 42, "total_tokens": 72}), "[DONE]"]


def check_reasoning_code_and_markup(driver):
    """An answer whose text we choose (the page's fetch answered by the page): reasoning folded, markup as text,
    a readable code block, tokens/s from the stream's usage."""
    driver.execute_script(STUB_NEXT_ANSWER, stub_events())
    send(driver, "Write add() in Python, thinking first.")
    answer = wait_answered(driver)
    details = answer.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.is_displayed() and not details.get_property("open"), "reasoning shown, folded"
    assert not answer.find_element(By.CSS_SELECTOR, ".reasoning-text").is_displayed()
    content = answer.find_element(By.CSS_SELECTOR, ".content")
    assert 'Here it is <img src=x onerror="window.pwned = 3">:' in content.text, content.text
    assert "<script>window.pwned = 4</script>" in content.text and "<think>" not in content.text, content.text
    assert not find_all(driver, "#messages img, #messages script")
    assert driver.execute_script("return window.pwned") is None
    check_code_block(answer.find_element(By.CSS_SELECTOR, "pre"))
    after = answer.find_element(By.CSS_SELECTOR, "pre + p").get_property("textContent")
    assert after.startswith("Call add(1, 2)"), repr(after)  # no blank line between the block and the text
    assert stats_of(answer).startswith("42 tokens · ") and "tokens/s" in stats_of(answer), stats_of(answer)
    details.find_element(By.CSS_SELECTOR, "summary").click()
    wait_for(driver, lambda d: answer.find_element(By.CSS_SELECTOR, ".reasoning-text").is_displayed(), "unfolded")
    assert answer.find_element(By.CSS_SELECTOR, ".reasoning-text").text == STUB_REASONING
    assert driver.execute_script("return window.kvserveChat.page.requestMessages().at(-1).content").startswith(
        "Here it is"), "the thinking is not sent back"
    driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", answer)  # all of it, unfolded
    screenshot(driver, "reasoning")
    print("reasoning folded, markup as text, code block:", repr(content.text))


def check_code_block(pre):
    """A code block keeps its lines and indentation, in a monospace font of a readable size, scrolling sideways
    rather than wrapping."""
    code = pre.find_element(By.CSS_SELECTOR, "code")
    assert code.get_property("textContent") == STUB_CODE and code.get_attribute("class") == "language-python"
    assert pre.get_attribute("data-language") == "python"
    font = code.value_of_css_property("font-family")
    assert "monospace" in font and float(code.value_of_css_property("font-size").removesuffix("px")) >= 12, font
    assert pre.value_of_css_property("white-space") == "pre" and pre.value_of_css_property("overflow-x") == "auto"
    assert pre.value_of_css_property("background-color") != pre.find_element(
        By.XPATH, "ancestor::article").value_of_css_property("background-color"), "the block stands out"


def check_switch_models(driver):
    """The other model picked in the picker answers (the stream's model, the server's /v1/models), loaded on
    demand in place of the first (--models-max 1); the picker follows the statuses."""
    other = OTHER_MODELS[0]
    find(driver, "#new-chat").click()  # the other model's context is short: a fresh conversation
    pick_model(driver, other)
    assert find(driver, "#model-status").text == "not loaded: loads on the first message"
    driver.execute_script(RECORD_LENGTHS + RECORD_PENDING)
    set_value(driver, "#max-tokens", 60)
    send(driver, "Once upon a time")
    answer = wait_answered(driver)
    growth_steps(driver, 2)
    assert answer.find_element(By.CSS_SELECTOR, ".content").text, "the other model's text"
    assert answer.find_element(By.CSS_SELECTOR, ".role").text == f"Assistant ({other})"
    assert "tokens/s" in stats_of(answer), stats_of(answer)
    check_loading_noted(driver, answer, other)
    statuses = server_statuses()
    assert statuses[other] == "loaded" and statuses[MODEL_ID] == "unloaded", statuses
    assert metric("kvserve:model_loads_total") >= 2
    wait_for(driver, lambda d: model_options(d) == {other: other, MODEL_ID: f"{MODEL_ID} (not loaded)"},
             "the picker to show the switch")
    assert find(driver, "#model-status").text == "loaded"
    screenshot(driver, "models")
    print(f"switched to {other}: {answer.text!r}; server: {statuses}")


def check_loading_shown(driver):
    """A model loading on demand shows as loading in the picker and under the waiting answer (the real load is too
    quick to catch without timing it: the page's rendering of the status is checked instead)."""
    shown = driver.execute_script("""
      const page = window.kvserveChat.page;
      const models = [...page.models.values()];
      const chosen = page.el.model.value;
      page.showModels(models.map((m) => ({...m, status: {value: m.id === chosen ? 'loading' : 'unloaded'}})));
      const result = {options: [...page.el.model.options].map((o) => o.text), status: page.el.modelStatus.textContent,
                      loadingClass: page.el.modelStatus.classList.contains('loading')};
      page.showModels(models);
      return result;""")
    chosen = find(driver, "#model").get_property("value")
    assert f"{chosen} (loading…)" in shown["options"] and shown["status"] == "loading…", shown
    assert shown["loadingClass"], shown
    assert driver.execute_script("return window.kvserveChat.modelLabel({id: 'a'})") == "a"  # one-model server


def check_new_chat_code_answer(driver):
    find(driver, "#new-chat").click()
    assert not find_all(driver, "#messages .message")
    driver.refresh()
    wait_for(driver, lambda d: MODEL_ID in model_options(d), "the model list after New chat")
    assert not find_all(driver, "#messages .message")
    pick_model(driver, MODEL_ID)
    set_value(driver, "#max-tokens", 120)
    send(driver, "Write a Python function that adds two numbers, in a code block.")
    answer = wait_answered(driver)
    assert answer.find_element(By.CSS_SELECTOR, ".role").text == f"Assistant ({MODEL_ID})"
    print("code answer:", find_all(driver, "#messages .assistant pre") != [])
    screenshot(driver, "code")


def main():
    driver = start_browser()
    try:
        check_key_prompt_and_models(driver)
        check_settings_sent_and_streamed(driver)
        check_stop_keeps_partial_answer(driver)
        check_reload_restores(driver)
        check_model_text_is_never_html(driver)
        check_reasoning_code_and_markup(driver)
        if OTHER_MODELS:
            check_switch_models(driver)
        else:
            print("model switch not checked: the server has one model (KVSERVE_TEST_MODELS is empty)")
        check_loading_shown(driver)
        check_new_chat_code_answer(driver)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
    print("chat page OK")


if __name__ == "__main__":
    main()
