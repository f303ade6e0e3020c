"""The texts of self-summarization in the coding environment's format (report section 4, after Composer 1.5: when
the context fills, the model summarizes its work so far and continues from the summary).

  request(max_tokens)   the instruction the agent loop appends when a segment must end: the model's next turn is
                        its summary (no tool runs), within max_tokens tokens;
  resume(summary)       what the next segment holds after the task's first observation: the summary, framed, so
                        the model continues from it; the environment (sandbox, repository) is as the agent left it.

Both are bracketed lines like the environment's budget notice ("[turn 2 of 8; ...]"), so they read as the harness
speaking, not as a tool's output. `REQUEST_MARK` and `RESUME_MARK` start them: a scripted policy (or a reader of a
trajectory) finds them by these marks. `summary_text` is the summary a model turn wrote (its tool calls, if any,
are not run: the harness only keeps the text).
"""

from __future__ import annotations

REQUEST_MARK = "[context full: summarize]"
RESUME_MARK = "[summary of your earlier work]"
RESUME_END = "[end of summary; continue the task]"


def request(max_tokens: int) -> str:
  """The summary request appended after the segment's last observation."""
  return (f"\n{REQUEST_MARK} Summarize your work so far (what you found and still need, what you changed, what is "
          f"left) in at most {max_tokens} tokens, without tool calls; it replaces all after the task.\n")


def resume(summary: str) -> str:
  """The start of the next segment after the task's first observation: the summary the model wrote, framed."""
  return f"\n{RESUME_MARK}\n{summary.strip()}\n{RESUME_END}\n"


def is_request(observation: str) -> bool:
  """Whether an observation (as a scripted policy sees it) is the summary request."""
  return REQUEST_MARK in observation
