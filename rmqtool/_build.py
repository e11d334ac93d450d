"""Build step (setuptools ``build_py``, named in pyproject.toml): installs ``rmqtool-pyspark.pth`` beside
the packages, in wheels and editable installs alike (see rmqtool/spark/interpreter.py). Not imported at run
time; it imports nothing of rmqtool (setuptools loads it from its file).
"""

from pathlib import Path

from setuptools.command.build_py import build_py

PTH_NAME = "rmqtool-pyspark.pth"
# its one line: a broken or half-removed install must not print an error at every interpreter start
PTH_LINE = ('import sys; exec("try:\\n import rmqtool.spark.interpreter as m\\nexcept ImportError:\\n pass\\n'
            'else:\\n m.watch()")\n')


class BuildPy(build_py):
    def run(self):
        super().run()
        # an editable wheel holds what is installed into its unpacked tree, not build_lib
        target = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        Path(target).mkdir(parents=True, exist_ok=True)
        Path(target, PTH_NAME).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH_NAME))]
