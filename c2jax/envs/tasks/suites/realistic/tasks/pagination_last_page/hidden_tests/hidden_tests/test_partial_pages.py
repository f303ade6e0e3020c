import unittest

from paging.links import page_links
from paging.paginator import Paginator


class PartialPageTest(unittest.TestCase):

    def test_partial_last_page(self):
        p = Paginator(range(11), per_page=5)
        self.assertEqual(p.num_pages, 3)
        self.assertEqual(p.page(3), [10])

    def test_empty(self):
        p = Paginator([], per_page=5)
        self.assertEqual(p.num_pages, 1)
        self.assertEqual(p.page(1), [])

    def test_even_split_unchanged(self):
        self.assertEqual(Paginator(range(10), per_page=5).num_pages, 2)

    def test_links_include_partial_page(self):
        p = Paginator(range(95), per_page=10)
        self.assertEqual(page_links(p, 1), [1, 2, 3, 10])
