"""One SparkSession for Bastion's Spark jobs: local by default, quiet, on loopback.

PySpark is a thin Python layer over a Java program. ``SparkSession.builder`` starts a
JVM (the *driver*) through ``spark-submit``, talks to it over a local socket (py4j),
and the driver runs Python worker processes for the functions a job ships out
(``mapPartitions``). Where the work runs is the *master*:

- ``local[N]`` — the driver itself executes tasks with N threads, each feeding a
  Python worker; nothing but Java and the ``pyspark`` wheel is needed. ``local[2]``
  is the default: the machines Bastion is developed on have two cores.
- ``spark://HOST:7077``, ``k8s://...``, ``yarn`` — a cluster; executors on other
  machines run the tasks and must reach the driver, so ``driver_host`` must then be an
  address of this machine they can connect to, and the executors need Bastion
  installed in their Python.

Starting a session costs seconds (a JVM, Spark's classes, the Python daemon), so a
command makes one and uses it for all its work, and the tests share one per session.

Three things are decided here so that no job has to think of them:

- **Java first.** Without a Java runtime ``spark-submit`` dies with a shell error and
  PySpark then reports a py4j connection failure that says nothing about Java.
  `find_java` looks it up the way ``spark-submit`` does (``JAVA_HOME``, else ``java``
  on ``PATH``), checks its version against what the installed PySpark needs, and
  `SparkSetupError` says in one sentence what to install.
- **Loopback only.** The driver binds its RPC and block-manager ports to
  ``127.0.0.1`` (``spark.driver.host``, ``spark.driver.bindAddress``,
  ``SPARK_LOCAL_IP``) and the web UI is off, so a local analysis opens nothing on the
  machine's network address — the same rule as the local Ray.
- **Quiet.** Spark logs at INFO to the terminal and draws progress bars; a command's
  output must be its result. A log4j2 configuration that lets only errors through is
  handed to the driver JVM before it starts (``setLogLevel`` would come too late for
  the start-up lines), and the console progress bar is off.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bastion.storage.errors import BastionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"
LOOPBACK = "127.0.0.1"
#: Java needed by the installed PySpark: 4.x is built for Java 17, 3.5 runs on 8+.
_JAVA_FOR_PYSPARK_4 = 17
_JAVA_FOR_PYSPARK_3 = 8
_INSTALL_JAVA = ("install a Java runtime (e.g. `apt-get install openjdk-17-jre-headless`) "
                 "or set JAVA_HOME to one")

# Errors only, to stderr; written to a file because the driver JVM reads it at start.
_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = spark: %p %c{1}: %m%n
# Spark compares this logger's level with the root's and announces the difference
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""


class SparkSetupError(BastionError):
    """Spark cannot start on this machine (no Java, an old Java, no PySpark); the
    message is one sentence saying what to install."""


def _pyspark_major() -> int:
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("PySpark is not installed: install it with "
                              "`pip install 'bastion[spark]'`") from None
    return int(pyspark.__version__.split(".")[0])


def _java_version(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for "1.8.0_392"), None if it
    cannot be read (then Spark is left to judge)."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True,
                             timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_java() -> str:
    """The ``java`` executable Spark will run — ``$JAVA_HOME/bin/java``, else
    ``java`` on ``PATH`` — checked to be there and recent enough for the installed
    PySpark; `SparkSetupError` otherwise."""
    needed = _JAVA_FOR_PYSPARK_4 if _pyspark_major() >= 4 else _JAVA_FOR_PYSPARK_3
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = str(Path(java_home) / "bin" / "java")
        if not os.access(java, os.X_OK):
            raise SparkSetupError(
                f"Spark needs Java {needed} or newer, but JAVA_HOME={java_home} has no "
                "bin/java: point JAVA_HOME at a Java installation, or unset it to use "
                "the java on PATH")
    else:
        found = shutil.which("java")
        if found is None:
            raise SparkSetupError(f"Spark needs Java {needed} or newer and none was found "
                                  f"(no JAVA_HOME, no java on PATH): {_INSTALL_JAVA}")
        java = found
    version = _java_version(java)
    if version is not None and version < needed:
        raise SparkSetupError(f"Spark needs Java {needed} or newer but {java} is Java "
                              f"{version}: {_INSTALL_JAVA}")
    return java


def build_session(master: str = DEFAULT_MASTER, *, app_name: str = "bastion",
                  driver_host: str = LOOPBACK, verbose: bool = False) -> "SparkSession":
    """A SparkSession on ``master`` (``local[2]`` by default), quiet and without a web
    UI, its driver bound to ``driver_host`` (loopback by default; a cluster's
    executors need an address of this machine they can reach). Raises
    `SparkSetupError` before anything starts if Java or PySpark is missing.

    The driver JVM's own stderr (the JVM's start-up notices, Spark's error log) goes
    to ``spark-driver.log`` in a temporary directory, named by
    ``session.conf.get("spark.bastion.driverLog")``; ``verbose`` leaves it on the
    terminal. Failures still reach the caller: PySpark raises them with the Java and
    Python tracebacks. The caller stops the session (``session.stop()``)."""
    find_java()
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    log_dir = Path(tempfile.mkdtemp(prefix="bastion-spark-"))
    # Kept while this process lives (the log explains a failure), not after it: one
    # directory per command would otherwise pile up in /tmp.
    atexit.register(shutil.rmtree, log_dir, ignore_errors=True)
    log_config = log_dir / "log4j2.properties"
    log_config.write_text(_LOG4J2)
    driver_log = log_dir / "spark-driver.log"
    # Read by spark-submit's launcher and by Spark's own address lookup, which
    # otherwise warns that the host name is loopback and picks the network address.
    os.environ.setdefault("SPARK_LOCAL_IP", driver_host)
    conf = (SparkConf().setMaster(master).setAppName(app_name)
            .set("spark.driver.host", driver_host)
            .set("spark.driver.bindAddress", driver_host)
            .set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.extraJavaOptions",
                 f"-Dlog4j2.configurationFile=file:{log_config}")
            # Event logs are small: 200 shuffle partitions (the default) would make
            # every aggregation 200 tasks of nothing on two cores.
            .set("spark.sql.shuffle.partitions", "4")
            .set("spark.sql.session.timeZone", "UTC")
            .set("spark.bastion.driverLog", str(driver_log)))
    if master.startswith("local"):
        # Tasks run Bastion's own code (its store clients, msgpack): the workers must
        # be this interpreter, not whatever ``python3`` is first on PATH.
        # PySpark takes the workers' interpreter from this variable, not from its conf.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if verbose:
        context = SparkContext(conf=conf)
    else:
        with open(driver_log, "ab") as log:  # the JVM keeps its own copy of the fd
            gateway = launch_gateway(conf, popen_kwargs={"stderr": log})
        context = SparkContext(conf=conf, gateway=gateway)
    context.setLogLevel("ERROR")
    return SparkSession(context)
