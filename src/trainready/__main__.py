from trainready.cli.main import run

run()
