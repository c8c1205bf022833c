"""What operators and auditors use: accounts and keys, the console's views, statements
and ``walkeep verify``. Above tools and jobs: a console page may show a tool's answer."""
