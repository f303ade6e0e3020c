import unittest

from resilience.retry import retry


class AttemptsTest(unittest.TestCase):

    def test_all_attempts_made(self):
        calls, sleeps = [], []

        @retry(times=3, base_delay=0.1, sleep=sleeps.append)
        def always_fails():
            calls.append(1)
            raise OSError("down")

        with self.assertRaises(OSError):
            always_fails()
        self.assertEqual(len(calls), 3)
        self.assertEqual(sleeps, [0.1, 0.2])

    def test_succeeds_on_last_attempt(self):
        calls = []

        @retry(times=3, sleep=lambda s: None)
        def flaky():
            calls.append(1)
            if len(calls) < 3:
                raise ValueError("not yet")
            return "ok"

        self.assertEqual(flaky(), "ok")

    def test_single_attempt(self):
        @retry(times=1, sleep=lambda s: self.fail("no sleep expected"))
        def fails():
            raise KeyError("k")

        with self.assertRaises(KeyError):
            fails()

    def test_other_exceptions_propagate_at_once(self):
        calls = []

        @retry(times=5, exceptions=(OSError,), sleep=lambda s: None)
        def bad():
            calls.append(1)
            raise TypeError("bug")

        with self.assertRaises(TypeError):
            bad()
        self.assertEqual(len(calls), 1)
