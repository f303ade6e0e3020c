import unittest

from resilience.backoff import delays
from resilience.retry import retry


class RetryTest(unittest.TestCase):

    def test_delays(self):
        self.assertEqual(list(delays(1, 2, 4)), [1, 2, 4, 8])

    def test_success_first_try(self):
        @retry(times=3, sleep=lambda s: None)
        def ok():
            return "fine"

        self.assertEqual(ok(), "fine")


if __name__ == "__main__":
    unittest.main()
