// keeps the test-common library non-empty
