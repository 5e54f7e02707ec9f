package io.myriad.client;

/**
 * The outcome of one item of a batch call: a value or the error of that item alone.
 *
 * @param <T> the value type
 */
public final class ItemResult<T> {
    private final T value;
    private final MyriadException error;

    private ItemResult(T value, MyriadException error) {
        this.value = value;
        this.error = error;
    }

    /** A success. */
    public static <T> ItemResult<T> ok(T value) {
        return new ItemResult<>(value, null);
    }

    /** A failure. */
    public static <T> ItemResult<T> failed(MyriadException error) {
        return new ItemResult<>(null, error);
    }

    /** Whether the item succeeded. */
    public boolean isOk() {
        return error == null;
    }

    /** The value (null for a failed item). */
    public T value() {
        return value;
    }

    /** The error (null for a successful item). */
    public MyriadException error() {
        return error;
    }

    /** The value, or the item's error thrown. */
    public T get() {
        if (error != null) {
            throw error;
        }
        return value;
    }

    @Override
    public String toString() {
        return error == null ? "ok(" + value + ")" : "failed(" + error.getMessage() + ")";
    }
}
