import unittest

from paging.links import page_links
from paging.paginator import Paginator


class PagingTest(unittest.TestCase):

    def test_even_split(self):
        p = Paginator(range(10), per_page=5)
        self.assertEqual(p.num_pages, 2)
        self.assertEqual(p.page(2), [5, 6, 7, 8, 9])

    def test_out_of_range(self):
        with self.assertRaises(IndexError):
            Paginator(range(10), per_page=5).page(3)

    def test_links(self):
        p = Paginator(range(100), per_page=10)
        self.assertEqual(page_links(p, 5), [1, 3, 4, 5, 6, 7, 10])


if __name__ == "__main__":
    unittest.main()
