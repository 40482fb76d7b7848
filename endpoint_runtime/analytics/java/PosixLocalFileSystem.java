// Hadoop's local file system (file: paths, with its checksum files as before), except that
// permissions are set by a system call (java.nio) instead of a `chmod` process per file and
// directory, which is what Hadoop does when its native library is missing, as it is from
// Spark's jars. Compiled and used by endpoint_runtime/analytics/local_files.py.
package endpoint_runtime.analytics;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class PosixLocalFileSystem extends LocalFileSystem {
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  public PosixLocalFileSystem() {
    super(new Raw());
  }

  /** The raw file system under the checksums: only setPermission differs from Hadoop's. */
  public static class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      if ((mode & ~0777) != 0) { // sticky bit and the like: java.nio cannot set them
        super.setPermission(path, permission);
        return;
      }
      Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          set.add(BITS[bit]);
        }
      }
      try {
        Files.setPosixFilePermissions(pathToFile(path).toPath(), set);
      } catch (UnsupportedOperationException notPosix) { // a file system without modes
        super.setPermission(path, permission);
      }
    }
  }
}
